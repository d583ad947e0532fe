-- Flow control's store operations (celeriac/stores/redis_flow.py): unique jobs' locks
-- (leases in the lease layout, <ns>:lease:<name>, so SharedStore.release and lease read
-- them) and concurrency slots. Loaded alone (no common.lua); the caller passes full keys.
-- KEYS[1] the lease or the slots' zset (<ns>:slots:<name>: holder -> expiry in ms)
-- ARGV[1] the operation:
--   hold  owner ms       take the lease if free (or renew it if owner's); returns '' when
--                        owner holds it now, else the holder
--   swap  owner ms       owner holds the lease now, whoever held it; returns the previous
--                        holder ('' for none or owner itself)
--   take  holder limit ms  a slot for holder if fewer than limit live ones (lapsed ones
--                        dropped first); 1 if holder has one now
--   renew ms holder...   extend the live slots of these holders; returns how many are held
local op = ARGV[1]
if op == 'hold' then
  local held = redis.call('GET', KEYS[1])
  if held == false or held == ARGV[2] then
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
    return ''
  end
  return held
end
if op == 'swap' then
  local held = redis.call('GET', KEYS[1])
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  if held == false or held == ARGV[2] then
    return ''
  end
  return held
end
-- The zset lives as long as its longest slot (holders may pass different ttls).
local function extend(ttl)
  if redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if op == 'take' then
  local ttl = tonumber(ARGV[4])
  if redis.call('ZSCORE', KEYS[1], ARGV[2]) == false and
      redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
    return 0
  end
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[2])
  extend(ttl)
  return 1
end
-- renew
local ttl = tonumber(ARGV[2])
local held = 0
for i = 3, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) ~= false then
    redis.call('ZADD', KEYS[1], now + ttl, ARGV[i])
    held = held + 1
  end
end
if held > 0 then
  extend(ttl)
end
return held
