-- disconnect: the consumer stops. Every message it owns goes back to its queue uncounted,
-- its lease ends, and it leaves the idle sets of the queues it fetched from (a publish
-- would wake it in place of a consumer that is asleep). ARGV[2] consumer, [3..] those
-- queues. Returns how many went back.

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
for i = 3, #ARGV do
  redis.call('SREM', key('idle', ARGV[i]), me)
end
notify()
return moved
