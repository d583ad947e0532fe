"""The SQLite store: tables beside the broker's or the result store's, in its file
(several processes on one machine share it)::

    shared_leases(name TEXT PRIMARY KEY, owner TEXT, expires REAL)
    shared_buckets(name TEXT PRIMARY KEY, tokens REAL, stamp REAL)
    beat_entries(name TEXT PRIMARY KEY, data BLOB)
    beat_last(name TEXT PRIMARY KEY, due_ms INTEGER)
    beat_runs(run_key TEXT PRIMARY KEY, name TEXT, due_ms INTEGER, holder TEXT,
              claimed_at REAL)
    revoked(task_id TEXT PRIMARY KEY, expires REAL)

Every write is one ``BEGIN IMMEDIATE`` transaction, which takes the file's write lock
before its first read: a read-compute-write (a bucket, a lease, a claim's three checks)
sees no other writer in between. Times are this machine's clock (every process sharing
the file runs on it).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..clients.sqlite import Database, path_from_url
from .base import (
    BEAT_LEASE,
    LEDGER_LENGTH,
    RUN_KEY_TTL,
    Grant,
    Lease,
    Run,
    SharedStore,
    bucket_take,
    check_args,
    run_key,
)
from .sqlite_flow import SQLiteFlow

if TYPE_CHECKING:
    from ..settings import Settings

SCHEMA = """
CREATE TABLE IF NOT EXISTS shared_leases (
    name TEXT PRIMARY KEY, owner TEXT NOT NULL, expires REAL NOT NULL);
CREATE TABLE IF NOT EXISTS shared_buckets (
    name TEXT PRIMARY KEY, tokens REAL NOT NULL, stamp REAL NOT NULL);
CREATE TABLE IF NOT EXISTS beat_entries (name TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS beat_last (name TEXT PRIMARY KEY, due_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS beat_runs (
    run_key TEXT PRIMARY KEY, name TEXT NOT NULL, due_ms INTEGER NOT NULL,
    holder TEXT NOT NULL, claimed_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS beat_runs_claimed ON beat_runs (claimed_at);
CREATE TABLE IF NOT EXISTS revoked (task_id TEXT PRIMARY KEY, expires REAL NOT NULL);
"""
PRUNE_EVERY = 1000
"""Claims between two deletions of old run keys."""


class _Refused(Exception):
    """A refused claim: undo what the transaction wrote."""


class SQLiteStore(SQLiteFlow, SharedStore):
    kind = "SQLite"

    def __init__(self, url: str, settings: Settings | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(url, settings)
        self.db = Database(path_from_url(url.split(";")[0].strip()), SCHEMA,
                           role="shared store")
        self.clock = clock
        self._claims = 0

    # -- leases -------------------------------------------------------------------------
    def acquire(self, name: str, owner: str, ttl: float) -> bool:
        with self.db.transaction() as conn:
            now = self.clock()
            return conn.execute(
                "INSERT INTO shared_leases (name, owner, expires) VALUES (?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET owner = excluded.owner,"
                " expires = excluded.expires WHERE shared_leases.owner = excluded.owner"
                " OR shared_leases.expires <= ?", (name, owner, now + ttl, now)).rowcount == 1

    def release(self, name: str, owner: str) -> None:
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM shared_leases WHERE name = ? AND owner = ?",
                         (name, owner))

    def lease(self, name: str) -> Lease | None:
        rows = self.db.read("SELECT owner, expires FROM shared_leases WHERE name = ? AND"
                            " expires > ?", (name, self.clock()))
        return Lease(str(rows[0][0]), float(rows[0][1])) if rows else None

    # -- token buckets ------------------------------------------------------------------
    def take(self, name: str, rate: float, capacity: float, want: int) -> Grant:
        check_args(rate, capacity, want)
        with self.db.transaction() as conn:
            now = self.clock()
            row = conn.execute("SELECT tokens, stamp FROM shared_buckets WHERE name = ?",
                               (name,)).fetchone()
            tokens, stamp = (float(row[0]), float(row[1])) if row else (capacity, now)
            tokens, stamp, grant = bucket_take(tokens, stamp, now, rate, capacity, want)
            conn.execute("INSERT INTO shared_buckets (name, tokens, stamp) VALUES (?, ?, ?)"
                         " ON CONFLICT (name) DO UPDATE SET tokens = excluded.tokens,"
                         " stamp = excluded.stamp", (name, tokens, stamp))
        return grant

    # -- beat ---------------------------------------------------------------------------
    def _advance(self, conn: sqlite3.Connection, holder: str, name: str, due_ms: int) -> bool:
        if conn.execute("SELECT 1 FROM shared_leases WHERE name = ? AND owner = ? AND"
                        " expires > ?", (BEAT_LEASE, holder, self.clock())).fetchone() is None:
            return False
        return conn.execute(
            "INSERT INTO beat_last (name, due_ms) VALUES (?, ?) ON CONFLICT (name) DO UPDATE"
            " SET due_ms = excluded.due_ms WHERE beat_last.due_ms < excluded.due_ms",
            (name, due_ms)).rowcount == 1

    def claim(self, holder: str, name: str, due_ms: int) -> bool:
        self._claims += 1
        try:
            with self.db.transaction() as conn:
                if self._claims % PRUNE_EVERY == 0:
                    conn.execute("DELETE FROM beat_runs WHERE claimed_at < ?",
                                 (time.time() - RUN_KEY_TTL,))
                if not self._advance(conn, holder, name, due_ms):
                    return False
                if conn.execute(
                        "INSERT OR IGNORE INTO beat_runs (run_key, name, due_ms, holder,"
                        " claimed_at) VALUES (?, ?, ?, ?, ?)",
                        (run_key(name, due_ms), name, due_ms, holder, time.time())
                ).rowcount != 1:
                    # The key exists (the entry's last due time went with a removal):
                    # roll the last due time back and refuse.
                    raise _Refused
        except _Refused:
            return False
        return True

    def advance(self, holder: str, name: str, due_ms: int) -> bool:
        with self.db.transaction() as conn:
            return self._advance(conn, holder, name, due_ms)

    def last_runs(self) -> dict[str, int]:
        return {n: int(d) for n, d in self.db.read("SELECT name, due_ms FROM beat_last")}

    def runs(self, limit: int = LEDGER_LENGTH) -> list[Run]:
        rows = self.db.read("SELECT name, due_ms, holder FROM beat_runs"
                            " ORDER BY claimed_at DESC, due_ms DESC LIMIT ?", (limit,))
        return [Run(n, int(d), h) for n, d, h in rows]

    def entries(self) -> dict[str, bytes]:
        return {n: bytes(d) for n, d in self.db.read("SELECT name, data FROM beat_entries")}

    def put_entry(self, name: str, data: bytes) -> None:
        with self.db.transaction() as conn:
            conn.execute("INSERT INTO beat_entries (name, data) VALUES (?, ?) ON CONFLICT"
                         " (name) DO UPDATE SET data = excluded.data", (name, data))

    def remove_entry(self, name: str) -> bool:
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM beat_last WHERE name = ?", (name,))
            return conn.execute("DELETE FROM beat_entries WHERE name = ?",
                                (name,)).rowcount == 1

    # -- revoked ids --------------------------------------------------------------------
    def revoke(self, ids: Sequence[str], expires_at: float) -> None:
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM revoked WHERE expires <= ?", (time.time(),))
            # REPLACE gives the row a new rowid: max(rowid) is the version.
            conn.executemany("INSERT OR REPLACE INTO revoked VALUES (?, max(?, coalesce("
                             "(SELECT expires FROM revoked WHERE task_id = ?), 0)))",
                             [(i, expires_at, i) for i in ids])

    def revoked_version(self) -> object:
        return tuple(self.db.read("SELECT count(*), coalesce(max(rowid), 0) FROM revoked")[0])

    def revoked(self) -> dict[str, float]:
        rows = self.db.read("SELECT task_id, expires FROM revoked WHERE expires > ?",
                            (time.time(),))
        return {str(k): float(v) for k, v in rows}

    def close(self) -> None:
        self.db.close()
