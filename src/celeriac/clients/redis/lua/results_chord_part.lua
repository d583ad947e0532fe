-- KEYS: parts set, fired flag; ARGV: task id, chord size, expiry in ms (0: none).
return count(KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]))
