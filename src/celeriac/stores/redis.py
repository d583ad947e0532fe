"""The Redis store: one server, a failover list or Sentinel (``clients.redis.Connector``:
the broker's or result store's URL, its namespace, retries and failover; a Cluster is
refused there). Keys, under the URL's namespace ``<ns>`` (default ``celeriac``)::

    <ns>:lease:<name>      string  the holder; PX is the lease (Redis's clock expires it)
    <ns>:bucket:<name>     hash    tokens, stamp; expires once it would be full anyway
    <ns>:beat:entries      hash    entry name -> JSON
    <ns>:beat:last         hash    entry name -> last due time (ms)
    <ns>:beat:run:<key>    string  the claiming beat's id, EX RUN_KEY_TTL
    <ns>:beat:ledger       list    run keys, newest first, LTRIM to LEDGER_LENGTH
    <ns>:revoked           zset    revoked id -> its expiry (unix seconds)
    <ns>:revoked:v         string  INCR on every revoke: the version

The lease, the bucket and the claim are the scripts ``clients/redis/lua/store_*.lua``
(Redis runs a script without interleaving any other client's command); the revoked
ids' writes are one MULTI, and both keys expire with the newest revoke, so an idle
deployment keeps nothing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from ..clients.redis.connector import Connector
from ..clients.redis.scripts import script_source
from .base import (
    BEAT_LEASE,
    LEDGER_LENGTH,
    RUN_KEY_TTL,
    Grant,
    Lease,
    Run,
    SharedStore,
    check_args,
    parse_run_key,
    run_key,
)
from .redis_flow import RedisFlow

if TYPE_CHECKING:
    import redis
    from redis.commands.core import Script

    from ..settings import Settings


class RedisStore(RedisFlow, SharedStore):
    kind = "Redis"

    def __init__(self, url: str, settings: Settings | None = None) -> None:
        super().__init__(url, settings)
        # Connections of our own: the transport's belong to the worker's loop and to
        # its hot path; these are used from threads (the store is synchronous).
        self.conn = Connector(url.split(";"), self.settings, "shared store",
                              read_timeout=self.settings.broker_connection_timeout + 1.0)
        self._scripts: dict[str, Script] = {}

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        def op(client: redis.Redis, ns: str) -> Any:
            script = self._scripts.get(name)
            if script is None:
                # register_script only hashes the source; EVALSHA falls back to EVAL
                # (NOSCRIPT) by itself, so a restarted Redis needs nothing from us.
                script = self._scripts[name] = client.register_script(
                    script_source(f"store_{name}", prelude=None))
            return script(keys=[k and f"{ns}:{k}" for k in keys], args=list(args),
                          client=client)

        return self.conn.call(op)

    # -- leases -------------------------------------------------------------------------
    def acquire(self, name: str, owner: str, ttl: float) -> bool:
        ms = max(1, round(ttl * 1000))
        return int(self._run("lease", [f"lease:{name}"], ["acquire", owner, ms])) == 1

    def release(self, name: str, owner: str) -> None:
        self._run("lease", [f"lease:{name}"], ["release", owner])

    def lease(self, name: str) -> Lease | None:
        def read(client: redis.Redis, ns: str) -> list[Any]:
            with client.pipeline(transaction=True) as pipe:
                pipe.get(f"{ns}:lease:{name}")
                pipe.pttl(f"{ns}:lease:{name}")
                pipe.time()
                return pipe.execute()

        holder, pttl, (secs, micros) = self.conn.call(read)
        if holder is None or pttl < 0:
            return None
        return Lease(holder.decode(), secs + micros / 1e6 + pttl / 1000)

    # -- token buckets ------------------------------------------------------------------
    def take(self, name: str, rate: float, capacity: float, want: int) -> Grant:
        check_args(rate, capacity, want)
        granted, wait = self._run("take", [f"bucket:{name}"],
                                  [repr(rate), repr(capacity), want])
        return Grant(int(granted), float(wait))

    # -- beat ---------------------------------------------------------------------------
    def _claim(self, holder: str, name: str, due_ms: int, record: bool) -> bool:
        key = run_key(name, due_ms)
        return int(self._run(
            "claim", [f"lease:{BEAT_LEASE}", "beat:last", f"beat:run:{key}" if record else "",
                      "beat:ledger"],
            [holder, name, due_ms, RUN_KEY_TTL, key, LEDGER_LENGTH])) == 1

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

    # -- revoked ids --------------------------------------------------------------------
    def revoke(self, ids: Sequence[str], expires_at: float) -> None:
        def op(client: redis.Redis, ns: str) -> None:
            now = time.time()
            key, version = f"{ns}:revoked", f"{ns}:revoked:v"
            # Every revoke is now + the same expiry: the newest lives longest, so each
            # write sets the keys' life to its own.
            ttl = max(int(expires_at - now) + 1, 1)
            with client.pipeline(transaction=True) as pipe:
                pipe.zadd(key, dict.fromkeys(ids, expires_at))
                pipe.zremrangebyscore(key, "-inf", now)
                pipe.incr(version)
                pipe.expire(key, ttl)
                pipe.expire(version, ttl)
                pipe.execute()

        self.conn.call(op)

    def revoked_version(self) -> object:
        return self.conn.call(lambda client, ns: client.get(f"{ns}:revoked:v"))

    def revoked(self) -> dict[str, float]:
        def op(client: redis.Redis, ns: str) -> list[tuple[bytes, float]]:
            rows = cast("list[tuple[bytes, float]]", client.zrangebyscore(
                f"{ns}:revoked", time.time(), "+inf", withscores=True))
            return rows

        return {k.decode(): float(v) for k, v in self.conn.call(op)}

    def close(self) -> None:
        self.conn.close()
