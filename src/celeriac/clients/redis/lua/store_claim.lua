-- Beat's claim of a run key, or a move of an entry's last due time without a run
-- (celeriac/stores/redis.py). Loaded alone, without common.lua.
-- KEYS: the beat lease, the last-due-times hash, the run key (or '' to only advance),
--       the ledger list
-- ARGV: holder, entry name, due ms, run key ttl s, run key text, ledger length
-- 1 only if the holder holds the lease, the due time is later than the entry's last and
-- the run key is new; then the key is recorded and the last due time moved.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local last = redis.call('HGET', KEYS[2], ARGV[2])
if last and tonumber(last) >= tonumber(ARGV[3]) then return 0 end
if KEYS[3] ~= '' then
  if not redis.call('SET', KEYS[3], ARGV[1], 'NX', 'EX', ARGV[4]) then return 0 end
  redis.call('LPUSH', KEYS[4], ARGV[5])
  redis.call('LTRIM', KEYS[4], 0, tonumber(ARGV[6]) - 1)
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
return 1
