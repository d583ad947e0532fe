"""The shared store in the embedded broker's SQLite file (one machine, many processes).

Two tables beside the broker's, created on first use::

    coordination_buckets(name TEXT PRIMARY KEY, tokens REAL, stamp REAL)
    coordination_leases(name TEXT PRIMARY KEY, owner TEXT, expires REAL)

Each operation is one ``BEGIN IMMEDIATE`` transaction (the write lock: callers run one
after the other), so a read-compute-write cannot interleave with another's. The clock is
this machine's (``time.time()``): every process sharing the file shares it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .._sqlite import Database, path_from_url
from .base import Grant, SharedStore, bucket_take, check_args

SCHEMA = """
CREATE TABLE IF NOT EXISTS coordination_buckets (
    name TEXT PRIMARY KEY, tokens REAL NOT NULL, stamp REAL NOT NULL);
CREATE TABLE IF NOT EXISTS coordination_leases (
    name TEXT PRIMARY KEY, owner TEXT NOT NULL, expires REAL NOT NULL);
"""


class SQLiteStore(SharedStore):
    kind = "SQLite"

    def __init__(self, url: str, clock: Callable[[], float] = time.time) -> None:
        self.db = Database(path_from_url(url), SCHEMA)
        self.clock = clock

    def take(self, name: str, rate: float, capacity: float, want: int) -> Grant:
        check_args(rate, capacity, want)
        with self.db.transaction() as conn:
            now = self.clock()
            row = conn.execute("SELECT tokens, stamp FROM coordination_buckets "
                               "WHERE name = ?", (name,)).fetchone()
            tokens, stamp = (float(row[0]), float(row[1])) if row else (capacity, now)
            tokens, stamp, grant = bucket_take(tokens, stamp, now, rate, capacity, want)
            conn.execute("INSERT INTO coordination_buckets (name, tokens, stamp) "
                         "VALUES (?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
                         "tokens = excluded.tokens, stamp = excluded.stamp",
                         (name, tokens, stamp))
        return grant

    def acquire(self, name: str, owner: str, ttl: float) -> bool:
        with self.db.transaction() as conn:
            now = self.clock()
            cur = conn.execute(
                "INSERT INTO coordination_leases (name, owner, expires) VALUES (?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, "
                "expires = excluded.expires "
                "WHERE coordination_leases.owner = excluded.owner "
                "OR coordination_leases.expires <= ?",
                (name, owner, now + ttl, now))
            return cur.rowcount == 1

    def release(self, name: str, owner: str) -> None:
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM coordination_leases WHERE name = ? AND owner = ?",
                         (name, owner))

    def holder(self, name: str) -> str | None:
        rows = self.db.read("SELECT owner FROM coordination_leases WHERE name = ? AND "
                            "expires > ?", (name, self.clock()))
        return str(rows[0][0]) if rows else None

    def close(self) -> None:
        self.db.close()
