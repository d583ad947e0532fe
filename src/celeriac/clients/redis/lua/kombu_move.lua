-- Take messages out of unacked (if still there, unchanged when old is given) and put
-- them back: RPUSH to the front of their list, or into the delay store.
-- ARGV: unacked, unacked_index, delayed, delayed messages, our id counter; then groups of
-- (tag or '' for a message not taken from unacked, old value or '', list key, new
-- envelope, delay ms).
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local moved = 0
for i = 6, #ARGV, 5 do
  local tag, old = ARGV[i], ARGV[i + 1]
  local cur = tag == '' or redis.call('HGET', ARGV[1], tag)
  if cur and (old == '' or cur == old) then
    if tag ~= '' then
      redis.call('HDEL', ARGV[1], tag)
      redis.call('ZREM', ARGV[2], tag)
    end
    local delay = tonumber(ARGV[i + 4])
    if delay > 0 then
      local id = 'd' .. redis.call('INCR', ARGV[5])
      redis.call('HSET', ARGV[4], id, ARGV[i + 2] .. '\n' .. ARGV[i + 3])
      redis.call('ZADD', ARGV[3], now_ms + delay, id)
    else
      redis.call('RPUSH', ARGV[i + 2], ARGV[i + 3])
    end
    moved = moved + 1
  end
end
return moved
