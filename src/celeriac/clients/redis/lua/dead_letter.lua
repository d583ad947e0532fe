-- dead_letter: move a message the consumer owns to the dead-letter store, with the reason.
-- ARGV[2] consumer, [3] id, [4] reason. Returns 1, or 0 if the consumer did not own it.

local id = ARGV[3]
if redis.call('SREM', key('owned', ARGV[2]), id) == 0 then
  return 0
end
local t = redis.call('TIME')
redis.call('HSET', key('m', id), 'r', ARGV[4], 't', t[1] .. '.' .. string.format('%06d', t[2]))
redis.call('ZADD', key('dead'), redis.call('INCR', key('seq')), id)
return 1
