-- requeue: return messages the consumer owns to their queues, waking idle consumers.
-- ARGV[2] consumer, [3] "1": the hand-out does not count (never started), [4] delay in
-- ms (0: ready now; else they wait in the delay store), [5..] ids.
-- Returns how many went back.

local owned = key('owned', ARGV[2])
local uncounted = ARGV[3] == '1'
local delay = tonumber(ARGV[4])
local due = delay > 0 and now_ms() + delay
local moved = 0
for i = 5, #ARGV do
  local id = ARGV[i]
  if redis.call('SREM', owned, id) == 1 then
    if due then
      local q, _, old = read_head(id)
      if q then
        if uncounted then
          uncount(id, old)
        end
        put_delayed(id, q, due)
        moved = moved + 1
      end
    elseif make_ready(id, uncounted) then
      moved = moved + 1
    end
  end
end
notify()
return moved
