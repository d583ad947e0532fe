-- KEYS: result, expiring set, change feed, parts set, fired flag; ARGV: task id, value,
-- its expiry in ms (0: none) and unix time, chord size, chord expiry in ms, feed length.
-- As store_many then chord_part, in one round trip: the result is written first.
if tonumber(ARGV[3]) > 0 then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
else
  redis.call('SET', KEYS[1], ARGV[2])
  redis.call('ZREM', KEYS[2], ARGV[1])
end
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[7], '*', 't', ARGV[1])
return count(KEYS[4], KEYS[5], ARGV[1], tonumber(ARGV[5]), tonumber(ARGV[6]))
