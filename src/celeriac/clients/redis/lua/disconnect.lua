-- disconnect: the consumer stops. Every message it owns goes back to its queue uncounted
-- and its lease ends. ARGV[2] consumer. Returns how many went back.

local me = ARGV[2]
local owned = key('owned', me)
local moved = 0
for _, id in ipairs(redis.call('SMEMBERS', owned)) do
  if make_ready(id, true) then
    moved = moved + 1
  end
end
redis.call('DEL', owned, key('wake', me))
redis.call('ZREM', key('consumers'), me)
notify()
return moved
