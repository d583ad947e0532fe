-- kombu's direct exchange: LPUSH the envelope to each queue bound by the routing key.
-- ARGV: binding set, separator, routing key, envelope, expiry of the list (ms), the
-- global key prefix (queue names in bindings are unprefixed; their lists are not).
local sep = ARGV[2]
local n = 0
for _, member in ipairs(redis.call('SMEMBERS', ARGV[1])) do
  local a = string.find(member, sep, 1, true)
  if a and string.sub(member, 1, a - 1) == ARGV[3] then
    local b = string.find(member, sep, a + #sep, true)
    if b then
      local queue = ARGV[6] .. string.sub(member, b + #sep)
      redis.call('LPUSH', queue, ARGV[4])
      redis.call('PEXPIRE', queue, ARGV[5])
      n = n + 1
    end
  end
end
return n
