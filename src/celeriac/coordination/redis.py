"""The shared store on Redis: one Lua script per operation, times from Redis's clock.

Keys, under the URL's namespace: ``<ns>:bucket:<name>`` (hash: ``tokens``, ``stamp``;
expires once it would be full again anyway) and ``<ns>:lease:<name>`` (string: the
owner; ``PX`` is the lease). ``take`` reads the clock with ``TIME`` inside the script
(Redis replicates a script's effects, so this is allowed and deterministic on replicas),
so every worker refills the bucket by one clock. ``acquire`` is ``SET NX PX``, or
``PEXPIRE`` when the caller already holds the key; ``release`` deletes the key only if
the caller still holds it (a lease taken over meanwhile is not someone else's to drop).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis
from redis.commands.core import Script

from ..redisclient.connector import Connector
from .base import Grant, SharedStore, check_args

if TYPE_CHECKING:
    from ..settings import Settings

# The arithmetic of base.bucket_take, in Lua. Floats travel as strings with enough
# digits for microseconds of a unix time (Lua's tostring keeps only 14).
TAKE = """
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
"""
ACQUIRE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisStore(SharedStore):
    kind = "Redis"

    def __init__(self, urls: Sequence[str], settings: Settings) -> None:
        # Connections of our own: the transport's belong to the worker's loop and to
        # its hot path; these are used from the coordination thread.
        self.conn = Connector(urls, settings, "coordination",
                              read_timeout=settings.broker_connection_timeout)
        self._scripts: dict[str, Script] = {}

    def _run(self, source: str, key: str, args: Sequence[Any]) -> Any:
        def op(client: redis.Redis, namespace: str) -> Any:
            script = self._scripts.get(source)
            if script is None:
                # register_script only hashes the source; EVALSHA falls back to EVAL
                # (NOSCRIPT) by itself, so a restarted Redis needs nothing from us.
                script = self._scripts[source] = client.register_script(source)
            return script(keys=[f"{namespace}:{key}"], args=list(args), client=client)

        return self.conn.call(op)

    def take(self, name: str, rate: float, capacity: float, want: int) -> Grant:
        check_args(rate, capacity, want)
        granted, wait = self._run(TAKE, f"bucket:{name}", [repr(rate), repr(capacity), want])
        return Grant(int(granted), float(wait))

    def acquire(self, name: str, owner: str, ttl: float) -> bool:
        ms = max(1, round(ttl * 1000))
        return bool(self._run(ACQUIRE, f"lease:{name}", [owner, ms]))

    def release(self, name: str, owner: str) -> None:
        self._run(RELEASE, f"lease:{name}", [owner])

    def holder(self, name: str) -> str | None:
        value = self.conn.call(
            lambda client, ns: client.get(f"{ns}:lease:{name}"))
        return value.decode() if isinstance(value, bytes) else None

    def close(self) -> None:
        self.conn.close()
