local function count(j, t, s, flag, done, member, score, size, ttl, tid)
  if redis.call('GET', flag) == tid then
    return redis.call('ZRANGE', done, 0, -1)  -- the task that fired ran again
  end
  redis.call('ZADD', j, score, member)
  local ready = redis.call('ZCARD', j)
  local total = tonumber(redis.call('GET', s) or size) + tonumber(redis.call('GET', t) or '0')
  if ttl > 0 then
    redis.call('PEXPIRE', j, ttl)
    redis.call('PEXPIRE', t, ttl)
    redis.call('PEXPIRE', s, ttl)
  end
  if ready ~= total then return false end
  local set
  if ttl > 0 then set = redis.call('SET', flag, tid, 'NX', 'PX', ttl)
  else set = redis.call('SET', flag, tid, 'NX') end
  if not set then return false end
  redis.call('RENAME', j, done)
  if ttl > 0 then redis.call('PEXPIRE', done, ttl) end
  redis.call('DEL', t, s)
  return redis.call('ZRANGE', done, 0, -1)
end
