-- Returns 1 to the call that counted the chord full and set the flag to its task id, and
-- to a later call by that same task (it ran again), else 0.
local function count(parts, flag, task_id, size, ttl)
  redis.call('SADD', parts, task_id)
  local fired = 0
  if redis.call('SCARD', parts) >= size then
    if redis.call('SET', flag, task_id, 'NX') then
      fired = 1
    elseif redis.call('GET', flag) == task_id then
      fired = 1
    end
  end
  if ttl > 0 then
    redis.call('PEXPIRE', parts, ttl)
    redis.call('PEXPIRE', flag, ttl)
  end
  return fired
end
