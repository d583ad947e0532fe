-- KEYS: result, .j, .t, .s, fired flag, done; ARGV: value ('' to store nothing), its
-- expiry in ms (0: none), member, score, size, chord expiry in ms (0: none), task id.
if ARGV[1] ~= '' then
  if tonumber(ARGV[2]) > 0 then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  else redis.call('SET', KEYS[1], ARGV[1]) end
  redis.call('PUBLISH', KEYS[1], ARGV[1])
end
return count(KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], ARGV[3], ARGV[4],
             tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7])
