-- dead_letter: move a message the consumer owns to the dead-letter store, with the reason.
-- ARGV[2] consumer, [3] id, [4] reason. Returns 1, or 0 if the consumer did not own it.
-- A dead letter is a hash (common.lua's earlier layout) whatever the message's form: the
-- reason, time and count sit beside it, and dead letters are few.

local id = ARGV[3]
if redis.call('SREM', key('owned', ARGV[2]), id) == 0 then
  return 0
end
local k = key('m', id)
local q, s, e, b, old = read_msg(id)
if q and not old then
  local n = redis.call('HGET', key('counts'), id) or 0
  redis.call('HDEL', key('counts'), id)
  redis.call('DEL', k)
  redis.call('HSET', k, 'q', q, 's', s, 'n', n, 'e', e, 'b', b)
end
local t = redis.call('TIME')
redis.call('HSET', k, 'r', ARGV[4], 't', t[1] .. '.' .. string.format('%06d', t[2]))
redis.call('ZADD', key('dead'), redis.call('INCR', key('seq')), id)
return 1
