-- fanout_publish: one message, a copy of it ready in every queue bound to a fanout group
-- (Broadcast queues, transports/redis.py bind_fanout).
--   <ns>:fanout:<group>  zset  queue -> its binding's expiry (unix ms), renewed with the
--                              binding consumer's lease; lapsed bindings are dropped here.
-- ARGV[2] group, ARGV[3] score (9 - priority), ARGV[4] envelope, ARGV[5] body.
-- Returns the count of copies.

local bound = key('fanout', ARGV[2])
redis.call('ZREMRANGEBYSCORE', bound, '-inf', now_ms())
local queues = redis.call('ZRANGE', bound, 0, -1)
for _, q in ipairs(queues) do
  local id = new_id()
  store_msg(id, q, ARGV[3], ARGV[4], ARGV[5])
  redis.call('ZADD', key('q', q), ARGV[3], id)
  touched[q] = true
end
notify()
return #queues
