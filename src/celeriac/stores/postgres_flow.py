"""Flow control on PostgreSQL (``flow.FlowStore``), in the store's ``<ns>_leases``
table: a unique lock is a lease row; a slot of semaphore ``<name>`` is the row
``<name>#<holder>``. Times are the server's (``statement_timestamp()``).

``hold`` is the lease's conditional upsert, then (refused) a read of the holder, again
if the lease lapsed in between. ``swap`` updates the row it locked in a subquery (``FOR
UPDATE``: concurrent swaps queue, and each reads the holder the previous one left), or
inserts it when there is none.
A slot is taken in one transaction under an advisory lock on the semaphore's name, so
two workers cannot both count ``limit - 1`` and both take the last slot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from psycopg import sql

from .flow import SLOT_SEPARATOR, FlowStore, check_slot_args

if TYPE_CHECKING:
    import psycopg

    Conn = psycopg.Connection[tuple[Any, ...]]

T = TypeVar("T")
NOW = sql.SQL("extract(epoch FROM statement_timestamp())::float8")
HOLD_ATTEMPTS = 3
"""Tries of ``hold`` (``swap``) when the lease lapses (is made) between its two
statements."""


class PostgresFlow(FlowStore):
    """Mixed into ``PostgresStore`` (its ``tables``, ``_run`` and ``_rows``)."""

    tables: list[str]

    def _run(self, op: Callable[[Conn], T]) -> T:
        raise NotImplementedError  # PostgresStore's

    def _rows(self, query: sql.Composed, params: Any = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError  # PostgresStore's

    @property
    def _le(self) -> sql.Identifier:
        return sql.Identifier(self.tables[0])

    def hold(self, name: str, owner: str, ttl: float) -> str | None:
        take = sql.SQL(
            "INSERT INTO {le} AS l (name, owner, expires) VALUES (%s, %s, {now} + %s)"
            " ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner,"
            " expires = EXCLUDED.expires WHERE l.owner = EXCLUDED.owner OR l.expires <= {now}"
            " RETURNING 1").format(le=self._le, now=NOW)
        read = sql.SQL("SELECT owner FROM {} WHERE name = %s AND expires > {now}"
                       ).format(self._le, now=NOW)
        for _ in range(HOLD_ATTEMPTS):
            if self._rows(take, (name, owner, ttl)):
                return None
            rows = self._rows(read, (name,))
            if rows:
                return str(rows[0][0])
        raise RuntimeError(f"lease {name!r}: neither taken nor held after "
                           f"{HOLD_ATTEMPTS} tries")

    def swap(self, name: str, owner: str, ttl: float) -> str | None:
        # The subquery locks the row before the UPDATE writes it, so RETURNING gives
        # the holder as it was (a CTE would see the row as this statement left it).
        update = sql.SQL(
            "UPDATE {le} AS l SET owner = %(o)s, expires = {now} + %(t)s FROM (SELECT name,"
            " CASE WHEN expires > {now} THEN owner END AS old FROM {le} WHERE name = %(n)s"
            " FOR UPDATE) AS p WHERE l.name = p.name RETURNING p.old").format(le=self._le,
                                                                        now=NOW)
        insert = sql.SQL("INSERT INTO {} (name, owner, expires) VALUES (%(n)s, %(o)s,"
                         " {now} + %(t)s) ON CONFLICT DO NOTHING RETURNING 1"
                         ).format(self._le, now=NOW)
        params = {"n": name, "o": owner, "t": ttl}
        for _ in range(HOLD_ATTEMPTS):
            rows = self._rows(update, params)
            if rows:
                held = rows[0][0]
                return str(held) if held is not None and held != owner else None
            if self._rows(insert, params):
                return None
        raise RuntimeError(f"lease {name!r}: not swapped after {HOLD_ATTEMPTS} tries")

    def slot_take(self, name: str, holder: str, limit: int, ttl: float) -> bool:
        check_slot_args(limit, ttl)
        prefix = f"{name}{SLOT_SEPARATOR}"
        le = self._le
        lock = sql.SQL("SELECT pg_advisory_xact_lock(hashtext(%s))")
        prune = sql.SQL("DELETE FROM {} WHERE starts_with(name, %s) AND expires <= {now}"
                        ).format(le, now=NOW)
        count = sql.SQL("SELECT count(*), coalesce(bool_or(name = %s), false) FROM {}"
                        " WHERE starts_with(name, %s)").format(le)
        put = sql.SQL(
            "INSERT INTO {} (name, owner, expires) VALUES (%s, %s, {now} + %s)"
            " ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner,"
            " expires = EXCLUDED.expires").format(le, now=NOW)

        def op(conn: Conn) -> bool:
            with conn.transaction():
                conn.execute(lock, (f"{self.tables[0]}:{prefix}",))
                conn.execute(prune, (prefix,))
                row = conn.execute(count, (prefix + holder, prefix)).fetchone()
                assert row is not None
                if not row[1] and int(row[0]) >= limit:
                    return False
                conn.execute(put, (prefix + holder, holder, ttl))
                return True

        return self._run(op)

    def slot_release(self, name: str, holder: str) -> None:
        self._rows(sql.SQL("DELETE FROM {} WHERE name = %s").format(self._le),
                   (f"{name}{SLOT_SEPARATOR}{holder}",))

    def slot_renew(self, name: str, holders: Sequence[str], ttl: float) -> int:
        if not holders:
            return 0
        query = sql.SQL("UPDATE {} SET expires = {now} + %s WHERE name = ANY(%s) AND"
                        " expires > {now} RETURNING 1").format(self._le, now=NOW)
        names = [f"{name}{SLOT_SEPARATOR}{h}" for h in holders]
        return len(self._rows(query, (ttl, names)))

    def slot_holders(self, name: str) -> list[str]:
        query = sql.SQL("SELECT owner FROM {} WHERE starts_with(name, %s) AND"
                        " expires > {now} ORDER BY owner").format(self._le, now=NOW)
        return [str(r[0]) for r in self._rows(query, (f"{name}{SLOT_SEPARATOR}",))]


__all__ = ["PostgresFlow"]
