-- A token bucket of the shared store (celeriac/stores/redis.py): the arithmetic of
-- stores/base.bucket_take, on Redis's clock (TIME: Redis replicates a script's effects,
-- so this is allowed and deterministic on replicas). Loaded alone, without common.lua.
-- KEYS[1] the bucket <ns>:bucket:<name> (hash: tokens, stamp; it expires once it would
-- be full again anyway). ARGV[1] rate per second, [2] capacity, [3] tokens wanted.
-- Returns {granted, seconds to wait for the rest}. Floats travel as strings with enough
-- digits for microseconds of a unix time (Lua's tostring keeps only 14).
local rate, cap, want = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local s = redis.call('HMGET', KEYS[1], 'tokens', 'stamp')
local tokens, stamp = tonumber(s[1]) or cap, tonumber(s[2]) or now
tokens = math.min(cap, tokens + math.max(0, now - stamp) * rate)
local granted = math.max(0, math.min(want, math.floor(tokens + 1e-9)))
tokens = math.max(0, tokens - granted)
local wait = 0
if granted < want then
  wait = math.max(0, math.min(want - granted, cap) - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens),
           'stamp', string.format('%.6f', math.max(stamp, now)))
redis.call('PEXPIRE', KEYS[1], math.ceil(cap / rate * 1000) + 1000)
return {granted, string.format('%.6f', wait)}
