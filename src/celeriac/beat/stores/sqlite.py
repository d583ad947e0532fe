"""The SQLite store: tables in the broker's or result store's file (several processes on
one machine share it)::

    beat_lease(id INTEGER PRIMARY KEY CHECK (id = 1), holder TEXT, expires REAL)
    beat_entries(name TEXT PRIMARY KEY, data BLOB)
    beat_last(name TEXT PRIMARY KEY, due_ms INTEGER)
    beat_runs(run_key TEXT PRIMARY KEY, name TEXT, due_ms INTEGER, holder TEXT,
              claimed_at REAL)

Every write is one ``BEGIN IMMEDIATE`` transaction, which takes the file's write lock
before its first read: the lease check, the last due time's check and the run key's
insert of a claim see no other writer in between. Times are this machine's clock (every
process sharing the file runs on it).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..._sqlite import Database, path_from_url
from ..store import LEDGER_LENGTH, RUN_KEY_TTL, BeatStore, Lease, Run, run_key

if TYPE_CHECKING:
    import sqlite3

    from ...settings import Settings

SCHEMA = """
CREATE TABLE IF NOT EXISTS beat_lease (
    id INTEGER PRIMARY KEY CHECK (id = 1), holder TEXT NOT NULL, expires REAL NOT NULL);
CREATE TABLE IF NOT EXISTS beat_entries (name TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS beat_last (name TEXT PRIMARY KEY, due_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS beat_runs (
    run_key TEXT PRIMARY KEY, name TEXT NOT NULL, due_ms INTEGER NOT NULL,
    holder TEXT NOT NULL, claimed_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS beat_runs_claimed ON beat_runs (claimed_at)
"""
PRUNE_EVERY = 1000


class SQLiteStore(BeatStore):
    def __init__(self, url: str, settings: Settings) -> None:
        super().__init__(url, settings)
        self.db = Database(path_from_url(url), SCHEMA)
        self._claims = 0

    def acquire(self, holder: str, ttl: float) -> bool:
        now = time.time()
        with self.db.transaction() as conn:
            return conn.execute(
                "INSERT INTO beat_lease (id, holder, expires) VALUES (1, ?, ?)"
                " ON CONFLICT (id) DO UPDATE SET holder = excluded.holder,"
                " expires = excluded.expires WHERE beat_lease.holder = excluded.holder"
                " OR beat_lease.expires <= ?", (holder, now + ttl, now)).rowcount == 1

    def release(self, holder: str) -> None:
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM beat_lease WHERE holder = ?", (holder,))

    def leader(self) -> Lease | None:
        rows = self.db.read("SELECT holder, expires FROM beat_lease WHERE expires > ?",
                            (time.time(),))
        return Lease(rows[0][0], rows[0][1]) if rows else None

    def _claim(self, conn: sqlite3.Connection, holder: str, name: str, due_ms: int) -> bool:
        if conn.execute("SELECT 1 FROM beat_lease WHERE holder = ? AND expires > ?",
                        (holder, time.time())).fetchone() is None:
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
                if not self._claim(conn, holder, name, due_ms):
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
            return self._claim(conn, holder, name, due_ms)

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

    def close(self) -> None:
        self.db.close()


class _Refused(Exception):
    pass
