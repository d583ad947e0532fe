-- publish: store messages and make them ready (or delayed), waking idle consumers.
-- ARGV[2] count, then five per message: queue, score (9 - priority), delay in ms (0: ready
-- now), envelope, body. Returns the count.
-- A fair queue's message (broker_fair_queues) comes with the score "f<9 - priority>:<fair
-- key>" and gets a fair score (fair_score below): consumers then take the queue's keys in
-- turn, with no change to the fetch.

-- Fair queuing by start tags: a key's next message is tagged one past the later of its
-- key's last tag and the queue's virtual time (the tag of the message at its head when
-- last seen; <ns>:fair:<queue> field '' keeps it, so it never goes back), and the score is
-- the priority's step times SPAN plus the tag. A key that sends 50,000 at once tags them
-- 1..50,000; one that comes later starts at the head's tag, so its messages alternate
-- with the first key's from where the consumers are.
local SPAN = 1099511627776  -- 2^40 tags per priority step; 9 steps stay exact in a double
-- A batch reads each fair queue's state once and writes it back once (flush_fair).
local fair = {}
local function fair_score(q, s)
  local colon = string.find(s, ':', 1, true)
  local step = tonumber(string.sub(s, 2, colon - 1))
  local fair_key = 'k' .. string.sub(s, colon + 1)
  local state = fair[q]
  local last = nil
  if state == nil then
    local got = redis.call('HMGET', key('fair', q), '', fair_key)
    local vt = tonumber(got[1] or '0')
    last = tonumber(got[2] or '0')
    local head = redis.call('ZRANGE', key('q', q), 0, 0, 'WITHSCORES')
    if head[2] then
      vt = math.max(vt, tonumber(head[2]) % SPAN)
    end
    state = {vt = vt, tags = {}}
    fair[q] = state
  else
    last = state.tags[fair_key]
    if last == nil then
      last = tonumber(redis.call('HGET', key('fair', q), fair_key) or '0')
    end
  end
  local tag = math.max(state.vt, last) + 1
  state.tags[fair_key] = tag
  return step * SPAN + tag
end

local function flush_fair()
  for q, state in pairs(fair) do
    local args = {'', state.vt}
    for k, tag in pairs(state.tags) do
      args[#args + 1] = k
      args[#args + 1] = tag
    end
    redis.call('HSET', key('fair', q), unpack(args))
  end
end

local count = tonumber(ARGV[2])
local first = redis.call('INCRBY', key('seq'), count) - count + 1
local now = nil
for i = 0, count - 1 do
  local a = 3 + i * 5
  local q, s, delay = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2])
  if string.sub(s, 1, 1) == 'f' then
    s = fair_score(q, s)
  end
  local id = string.format('%016d', first + i)
  -- No count yet: the first hand-out's makes it 1.
  store_msg(id, q, s, ARGV[a + 3], ARGV[a + 4])
  if delay > 0 then
    now = now or now_ms()
    put_delayed(id, q, now + delay)
  else
    redis.call('ZADD', key('q', q), s, id)
    touched[q] = true
  end
end
flush_fair()
notify()
return count
