-- requeue: return messages the consumer owns to their queues, waking idle consumers.
-- ARGV[2] consumer, [3] "1": the hand-out does not count (never started), [4..] ids.
-- Returns how many went back.

local owned = key('owned', ARGV[2])
local uncount = ARGV[3] == '1'
local moved = 0
for i = 4, #ARGV do
  if redis.call('SREM', owned, ARGV[i]) == 1 and make_ready(ARGV[i], uncount) then
    moved = moved + 1
  end
end
notify()
return moved
