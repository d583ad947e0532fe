-- The shared store's one lease primitive (celeriac/stores/redis.py): Gossip's elections
-- and the beat lease. Loaded alone: common.lua is NOT prepended (nor is ARGV[1] the
-- namespace); the caller passes the full key.
-- KEYS[1] the lease <ns>:lease:<name> (string: the holder; PX: Redis's clock expires it)
-- ARGV[1] 'acquire' or 'release', [2] the owner, [3] (acquire) the lease in ms.
-- acquire: take it if free or lapsed, renew it if the owner holds it; 1 if it does now.
-- release: delete it only if the owner still holds it (a lease taken over meanwhile is
-- not this owner's to drop); 1 if it did.
local held = redis.call('GET', KEYS[1])
if ARGV[1] == 'release' then
  if held == ARGV[2] then
    redis.call('DEL', KEYS[1])
    return 1
  end
  return 0
end
if held == false or held == ARGV[2] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
