"""The Redis store.

Keys (``<ns>`` is the URL's ``?namespace=``, default ``celeriac``)::

    <ns>:beat:lease         string  the leading beat's id, SET PX beat_lease_timeout
                                    (Redis expires it: the server's clock decides)
    <ns>:beat:entries       hash    entry name -> JSON
    <ns>:beat:last          hash    entry name -> last due time (ms)
    <ns>:beat:run:<key>     string  the claiming beat's id, EX RUN_KEY_TTL
    <ns>:beat:ledger        list    run keys, newest first, LTRIM to LEDGER_LENGTH

The lease and the claim are Lua scripts: Redis runs a script without interleaving any
other client's command, so "still the lease holder, due time later than the last, key
new" and the writes that follow are one step for every beat.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ...redisclient import Connector
from ..store import LEDGER_LENGTH, RUN_KEY_TTL, BeatStore, Lease, Run, parse_run_key, run_key

if TYPE_CHECKING:
    import redis

    from ...settings import Settings

ACQUIRE = """
-- KEYS: lease; ARGV: holder, ttl ms. 1 if the holder has the lease now.
local current = redis.call('GET', KEYS[1])
if current == false or current == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""

RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

CLAIM = """
-- KEYS: lease, last hash, run key (or '' to only advance), ledger
-- ARGV: holder, entry name, due ms, run key ttl s, run key text, ledger length
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
"""


class RedisStore(BeatStore):
    def __init__(self, url: str, settings: Settings) -> None:
        super().__init__(url, settings)
        self.conn = Connector(url.split(";"), settings, "beat",
                              read_timeout=settings.broker_connection_timeout + 1.0)

    def _script(self, source: str, keys: list[str], args: list[Any]) -> int:
        def run(client: redis.Redis, ns: str) -> Any:
            # register_script: EVALSHA, loading the script on NOSCRIPT.
            return client.register_script(source)(
                keys=[k.format(ns=ns) for k in keys], args=args)

        return int(self.conn.call(run))

    def acquire(self, holder: str, ttl: float) -> bool:
        return self._script(ACQUIRE, ["{ns}:beat:lease"],
                            [holder, max(1, int(ttl * 1000))]) == 1

    def release(self, holder: str) -> None:
        self._script(RELEASE, ["{ns}:beat:lease"], [holder])

    def leader(self) -> Lease | None:
        def read(client: redis.Redis, ns: str) -> list[Any]:
            pipe = client.pipeline(transaction=True)
            pipe.get(f"{ns}:beat:lease")
            pipe.pttl(f"{ns}:beat:lease")
            pipe.time()
            return pipe.execute()

        holder, pttl, (secs, micros) = self.conn.call(read)
        if holder is None or pttl < 0:
            return None
        return Lease(holder.decode(), secs + micros / 1e6 + pttl / 1000)

    def _claim(self, holder: str, name: str, due_ms: int, record: bool) -> bool:
        key = run_key(name, due_ms)
        return self._script(
            CLAIM, ["{ns}:beat:lease", "{ns}:beat:last",
                    "{ns}:beat:run:" + key.replace("{", "{{").replace("}", "}}")
                    if record else "", "{ns}:beat:ledger"],
            [holder, name, due_ms, RUN_KEY_TTL, key, LEDGER_LENGTH]) == 1

    def claim(self, holder: str, name: str, due_ms: int) -> bool:
        return self._claim(holder, name, due_ms, True)

    def advance(self, holder: str, name: str, due_ms: int) -> bool:
        return self._claim(holder, name, due_ms, False)

    def last_runs(self) -> dict[str, int]:
        raw = cast("dict[bytes, bytes]", self.conn.call(
            lambda client, ns: client.hgetall(f"{ns}:beat:last")))
        return {k.decode(): int(v) for k, v in raw.items()}

    def runs(self, limit: int = LEDGER_LENGTH) -> list[Run]:
        def read(client: redis.Redis, ns: str) -> list[Any]:
            keys = cast("list[bytes]", client.lrange(f"{ns}:beat:ledger", 0, limit - 1))
            if not keys:
                return []
            holders = cast("list[bytes | None]",
                           client.mget([f"{ns}:beat:run:{k.decode()}" for k in keys]))
            return list(zip(keys, holders, strict=True))

        out = []
        for key, holder in self.conn.call(read):
            name, due = parse_run_key(key.decode())
            out.append(Run(name, due, holder.decode() if holder else ""))
        return out

    def entries(self) -> dict[str, bytes]:
        raw = cast("dict[bytes, bytes]", self.conn.call(
            lambda client, ns: client.hgetall(f"{ns}:beat:entries")))
        return {k.decode(): v for k, v in raw.items()}

    def put_entry(self, name: str, data: bytes) -> None:
        self.conn.call(lambda client, ns: client.hset(f"{ns}:beat:entries", name, data))

    def remove_entry(self, name: str) -> bool:
        def drop(client: redis.Redis, ns: str) -> list[Any]:
            with client.pipeline(transaction=True) as pipe:
                pipe.hdel(f"{ns}:beat:entries", name)
                pipe.hdel(f"{ns}:beat:last", name)
                return pipe.execute()

        return int(self.conn.call(drop)[0]) == 1

    def close(self) -> None:
        self.conn.close()
