"""The broker's record of revoked task ids, so that a revoke is not forgotten.

``app.control.revoke`` writes the ids here (with the workers' expiry) before it
broadcasts; a worker loads them at start and whenever the store's version moves
(``worker/revoked.py``), so a worker that starts later, restarts, or missed the
broadcast still honours the revoke.

Where the record lives:

- Redis broker: a sorted set ``<ns>:revoked`` (id scored by its expiry) and a version
  counter ``<ns>:revoked:v``; both keys expire with the newest revoke, so an idle
  deployment keeps nothing.
- SQLite broker: a ``revoked`` table in the broker's file.
- memory broker: beside the broker, in this process.
- RabbitMQ broker: the result backend's store when it is Redis, PostgreSQL (a
  ``<namespace>_revoked`` table) or SQLite; with another backend, only the broadcast and
  ``--statedb`` remember a revoke.

A version is whatever the store can read cheaply that changes with every write; a
worker compares it each second and reads the ids only when it moved.
"""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..app import Celeriac
    from ..settings import Settings

Loaded = tuple[object, dict[str, float] | None]


class RevokedStore(abc.ABC):
    @abc.abstractmethod
    def add(self, ids: Sequence[str], expires_at: float) -> None:
        """Record ``ids`` as revoked until ``expires_at`` (time.time())."""

    @abc.abstractmethod
    def version(self) -> object:
        """Changes whenever ``add`` ran."""

    @abc.abstractmethod
    def load(self) -> dict[str, float]:
        """Every id not yet expired, with its expiry."""

    def load_if_changed(self, version: object) -> Loaded:
        """(version, ids), ids None when the version is ``version`` still. The version is
        read first: an add between the two reads is seen again next time, not lost."""
        current = self.version()
        if current == version:
            return current, None
        return current, self.load()

    def close(self) -> None:
        """Release connections."""


class RedisStore(RevokedStore):
    def __init__(self, url: str, settings: Settings) -> None:
        from ..redisclient.connector import Connector

        self.conn = Connector(url.split(";"), settings, "revoked",
                              read_timeout=settings.broker_connection_timeout)

    def add(self, ids: Sequence[str], expires_at: float) -> None:
        def op(client: Any, ns: str) -> None:
            now = time.time()
            key, version = f"{ns}:revoked", f"{ns}:revoked:v"
            # Every add is now + the same expiry: the newest revoke lives longest, so
            # each write sets the keys' life to its own.
            ttl = max(int(expires_at - now) + 1, 1)
            with client.pipeline(transaction=True) as pipe:
                pipe.zadd(key, {i: expires_at for i in ids})
                pipe.zremrangebyscore(key, "-inf", now)
                pipe.incr(version)
                pipe.expire(key, ttl)
                pipe.expire(version, ttl)
                pipe.execute()

        self.conn.call(op)

    def version(self) -> object:
        return self.conn.call(lambda c, ns: c.get(f"{ns}:revoked:v"))

    def load(self) -> dict[str, float]:
        def op(client: Any, ns: str) -> list[tuple[bytes, float]]:
            rows: list[tuple[bytes, float]] = client.zrangebyscore(
                f"{ns}:revoked", time.time(), "+inf", withscores=True)
            return rows

        return {k.decode(): float(v) for k, v in self.conn.call(op)}

    def close(self) -> None:
        self.conn.close()


_SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS revoked (task_id TEXT PRIMARY KEY, expires REAL NOT NULL);
"""


class SQLiteStore(RevokedStore):
    def __init__(self, url: str) -> None:
        from .._sqlite import Database, path_from_url

        self.db = Database(path_from_url(url), _SQLITE_SCHEMA)

    def add(self, ids: Sequence[str], expires_at: float) -> None:
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM revoked WHERE expires <= ?", (time.time(),))
            # REPLACE gives the row a new rowid: max(rowid) is the version.
            conn.executemany("INSERT OR REPLACE INTO revoked VALUES (?, max(?, coalesce("
                             "(SELECT expires FROM revoked WHERE task_id = ?), 0)))",
                             [(i, expires_at, i) for i in ids])

    def version(self) -> object:
        return tuple(self.db.read("SELECT count(*), coalesce(max(rowid), 0) FROM revoked")[0])

    def load(self) -> dict[str, float]:
        rows = self.db.read("SELECT task_id, expires FROM revoked WHERE expires > ?",
                            (time.time(),))
        return {str(k): float(v) for k, v in rows}

    def close(self) -> None:
        self.db.close()


class MemoryStore(RevokedStore):
    _lock = threading.Lock()

    def __init__(self, broker: Any) -> None:
        # Kept on the broker object: it lives as long as the broker, in its process.
        with self._lock:
            ids: dict[str, float] | None = getattr(broker, "revoked_ids", None)
            if ids is None:
                ids = {}
                broker.revoked_ids = ids
            self.ids = ids

    def add(self, ids: Sequence[str], expires_at: float) -> None:
        with self._lock:
            for i in ids:
                self.ids[i] = max(expires_at, self.ids.get(i, 0.0))

    def version(self) -> object:
        with self._lock:
            return len(self.ids), max(self.ids.values(), default=0.0)

    def load(self) -> dict[str, float]:
        now = time.time()
        with self._lock:
            return {k: v for k, v in self.ids.items() if v > now}


class PostgresStore(RevokedStore):
    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.table = backend.table.removesuffix("_results") + "_revoked"
        self._ready = False

    def _run(self, sql: str, params: Sequence[Any] = (), many: bool = False) -> list[Any]:
        from psycopg import sql as q

        table = q.Identifier(self.table)

        def op(conn: Any) -> list[Any]:
            if not self._ready:
                conn.execute(q.SQL("CREATE TABLE IF NOT EXISTS {} (task_id text PRIMARY KEY,"
                                   " expires double precision NOT NULL,"
                                   " written double precision NOT NULL)").format(table))
                self._ready = True
            statement = q.SQL(sql).format(t=table)
            if many:
                with conn.cursor() as cur:
                    cur.executemany(statement, params)
                return []
            cur = conn.execute(statement, params)
            return list(cur.fetchall()) if cur.description else []

        result: list[Any] = self.backend._run(op)
        return result

    def add(self, ids: Sequence[str], expires_at: float) -> None:
        now = time.time()
        self._run("DELETE FROM {t} WHERE expires <= %s", (now,))
        self._run("INSERT INTO {t} VALUES (%s, %s, %s) ON CONFLICT (task_id) DO UPDATE SET"
                  " expires = greatest({t}.expires, EXCLUDED.expires), written ="
                  " EXCLUDED.written", [(i, expires_at, now) for i in ids], many=True)

    def version(self) -> object:
        return tuple(self._run("SELECT count(*), coalesce(max(written), 0) FROM {t}")[0])

    def load(self) -> dict[str, float]:
        rows = self._run("SELECT task_id, expires FROM {t} WHERE expires > %s", (time.time(),))
        return {str(k): float(v) for k, v in rows}


def store_for(app: Celeriac) -> RevokedStore | None:
    """The revoked-id store of ``app``'s broker (or its result backend, on RabbitMQ);
    None where there is none."""
    settings = app.settings
    broker = settings.broker_url.split(";")[0].strip()
    scheme = broker.partition("://")[0]
    if scheme in ("redis", "rediss"):
        return RedisStore(settings.broker_url, settings)
    if scheme == "sqlite":
        return SQLiteStore(broker)
    if scheme == "memory":
        return MemoryStore(getattr(app.transport, "broker", None))
    backend = settings.backend_url
    bscheme = backend.partition("://")[0]
    if bscheme in ("redis", "rediss"):
        return RedisStore(backend, settings)
    if bscheme == "sqlite":
        return SQLiteStore(backend)
    if bscheme in ("postgresql", "postgres"):
        return PostgresStore(app.backend)
    return None
