"""Flow control on SQLite (``flow.FlowStore``), in the store's ``shared_leases`` table:
a unique lock is a lease row; a slot of semaphore ``<name>`` is the row
``<name>#<holder>``, counted by a range scan of the primary key. Each operation is one
``BEGIN IMMEDIATE`` transaction (the file's write lock before its first read)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from .flow import SLOT_SEPARATOR, FlowStore, check_slot_args

if TYPE_CHECKING:
    from ..clients.sqlite import Database


def _bounds(name: str) -> tuple[str, str]:
    """The primary-key range of semaphore ``name``'s slot rows."""
    prefix = f"{name}{SLOT_SEPARATOR}"
    return prefix, prefix[:-1] + chr(ord(SLOT_SEPARATOR) + 1)


class SQLiteFlow(FlowStore):
    """Mixed into ``SQLiteStore`` (its ``db`` and ``clock``)."""

    db: Database
    clock: Callable[[], float]

    def _tx(self) -> AbstractContextManager[sqlite3.Connection]:
        return self.db.transaction()

    def _holder(self, conn: sqlite3.Connection, name: str, now: float) -> str | None:
        row = conn.execute("SELECT owner FROM shared_leases WHERE name = ? AND expires > ?",
                           (name, now)).fetchone()
        return str(row[0]) if row else None

    def _put(self, conn: sqlite3.Connection, name: str, owner: str, expires: float) -> None:
        conn.execute("INSERT INTO shared_leases (name, owner, expires) VALUES (?, ?, ?)"
                     " ON CONFLICT (name) DO UPDATE SET owner = excluded.owner,"
                     " expires = excluded.expires", (name, owner, expires))

    def hold(self, name: str, owner: str, ttl: float) -> str | None:
        with self._tx() as conn:
            now = self.clock()
            held = self._holder(conn, name, now)
            if held is not None and held != owner:
                return held
            self._put(conn, name, owner, now + ttl)
            return None

    def swap(self, name: str, owner: str, ttl: float) -> str | None:
        with self._tx() as conn:
            now = self.clock()
            held = self._holder(conn, name, now)
            self._put(conn, name, owner, now + ttl)
            return held if held != owner else None

    def slot_take(self, name: str, holder: str, limit: int, ttl: float) -> bool:
        check_slot_args(limit, ttl)
        low, high = _bounds(name)
        with self._tx() as conn:
            now = self.clock()
            conn.execute("DELETE FROM shared_leases WHERE name >= ? AND name < ? AND"
                         " expires <= ?", (low, high, now))
            mine = low + holder
            count, has = conn.execute(
                "SELECT count(*), coalesce(sum(name = ?), 0) FROM shared_leases"
                " WHERE name >= ? AND name < ?", (mine, low, high)).fetchone()
            if not has and count >= limit:
                return False
            self._put(conn, mine, holder, now + ttl)
            return True

    def slot_release(self, name: str, holder: str) -> None:
        with self._tx() as conn:
            conn.execute("DELETE FROM shared_leases WHERE name = ?",
                         (f"{name}{SLOT_SEPARATOR}{holder}",))

    def slot_renew(self, name: str, holders: Sequence[str], ttl: float) -> int:
        if not holders:
            return 0
        with self._tx() as conn:
            now = self.clock()
            return sum(conn.execute(
                "UPDATE shared_leases SET expires = ? WHERE name = ? AND expires > ?",
                (now + ttl, f"{name}{SLOT_SEPARATOR}{h}", now)).rowcount for h in holders)

    def slot_holders(self, name: str) -> list[str]:
        low, high = _bounds(name)
        rows = self.db.read("SELECT owner FROM shared_leases WHERE name >= ? AND name < ?"
                            " AND expires > ? ORDER BY owner", (low, high, self.clock()))
        return [str(r[0]) for r in rows]


__all__ = ["SQLiteFlow"]
