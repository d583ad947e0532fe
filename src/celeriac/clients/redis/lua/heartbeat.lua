-- heartbeat: renew this consumer's lease, and return ALL messages of every consumer whose
-- lease ran out to their queues, in this one pass. Their delivery counts stay: the next
-- hand-out counts one more. A consumer whose lease is current keeps its messages however
-- long it holds them.
-- ARGV[2] consumer, [3] lease in ms. Returns how many messages went back.

local me = ARGV[2]
local now = now_ms()
local consumers = key('consumers')
redis.call('ZADD', consumers, now + tonumber(ARGV[3]), me)
local restored = 0
for _, c in ipairs(redis.call('ZRANGEBYSCORE', consumers, '-inf', string.format('(%d', now))) do
  local owned = key('owned', c)
  for _, id in ipairs(redis.call('SMEMBERS', owned)) do
    if make_ready(id, false) then
      restored = restored + 1
    end
  end
  redis.call('DEL', owned, key('wake', c))
  redis.call('ZREM', consumers, c)
end
notify()
return restored
