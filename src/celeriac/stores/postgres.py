"""The PostgreSQL store, in the result backend's database. Tables per namespace (the
URL's ``?namespace=``, as for results), created on first use under an advisory lock::

    <ns>_leases(name text PRIMARY KEY, owner text, expires float8)
    <ns>_buckets(name text PRIMARY KEY, tokens float8, stamp float8, granted int)
    <ns>_beat_entries(name text PRIMARY KEY, data text)
    <ns>_beat_last(name text PRIMARY KEY, due_ms bigint)
    <ns>_beat_runs(run_key text PRIMARY KEY, name text, due_ms bigint, holder text,
                   claimed_at timestamptz)
    <ns>_revoked(task_id text PRIMARY KEY, expires float8, written float8)

Times are the server's (``statement_timestamp()``, seconds since the epoch). A lease is
one upsert whose DO UPDATE applies only when the caller holds it or it has lapsed.
``take`` is one ``UPDATE ... RETURNING``: the row lock orders concurrent callers, and
under READ COMMITTED a caller that waited for the lock re-evaluates its SET expressions
against the row as the previous caller left it, so the arithmetic (``base.bucket_take``
in SQL) always starts from the latest state; ``granted`` is a column only so that
RETURNING can report what this statement took. A claim is one transaction: it locks the
beat lease's row ``FOR SHARE`` (a beat taking the lease over waits for the claim to
commit, and a claim after a take-over sees the new holder), moves the last due time
forward only if the due time is later (a conditional upsert: of two concurrent claims,
the second re-checks the row after the first commits), and inserts the run key ``ON
CONFLICT DO NOTHING``; any refusal rolls it all back. Run keys older than
``RUN_KEY_TTL`` are deleted now and then.

Each thread has its own connection (autocommit); one whose connection dropped (a server
restart) opens another and runs the operation once more: every operation here may be
repeated (a claim whose commit went unconfirmed is refused the second time, and its run
is not sent: at most once).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg import sql

from ..backends.postgres import check_namespace, split_url
from ..errors import BrokerUnavailable, OperationalError
from .base import (
    BEAT_LEASE,
    LEDGER_LENGTH,
    RUN_KEY_TTL,
    Grant,
    Lease,
    Run,
    SharedStore,
    check_args,
    run_key,
    wait_for,
)
from .postgres_flow import PostgresFlow

if TYPE_CHECKING:
    from ..settings import Settings

logger = logging.getLogger("celeriac.stores.postgres")
T = TypeVar("T")
Conn = psycopg.Connection[tuple[Any, ...]]
NOW = sql.SQL("extract(epoch FROM statement_timestamp())::float8")
PRUNE_EVERY = 1000
"""Claims between two deletions of old run keys."""
TABLES = ("leases", "buckets", "beat_entries", "beat_last", "beat_runs", "revoked")


class _Rollback(Exception):
    """A refused claim: undo what the transaction wrote."""


def _ddl(le: sql.Identifier, b: sql.Identifier, entries: sql.Identifier,
         last: sql.Identifier, runs: sql.Identifier, revoked: sql.Identifier
         ) -> list[sql.Composed]:
    """The tables, made on first use (the schema in the module's docstring)."""
    return [sql.SQL(s).format(t) for s, t in (
        ("CREATE TABLE IF NOT EXISTS {} (name text PRIMARY KEY, owner text NOT NULL,"
         " expires float8 NOT NULL)", le),
        ("CREATE TABLE IF NOT EXISTS {} (name text PRIMARY KEY, tokens float8 NOT NULL,"
         " stamp float8 NOT NULL, granted int NOT NULL DEFAULT 0)", b),
        ("CREATE TABLE IF NOT EXISTS {} (name text PRIMARY KEY, data text NOT NULL)",
         entries),
        ("CREATE TABLE IF NOT EXISTS {} (name text PRIMARY KEY, due_ms bigint NOT NULL)",
         last),
        ("CREATE TABLE IF NOT EXISTS {} (run_key text PRIMARY KEY, name text NOT NULL,"
         " due_ms bigint NOT NULL, holder text NOT NULL,"
         " claimed_at timestamptz NOT NULL DEFAULT clock_timestamp())", runs),
        ("CREATE TABLE IF NOT EXISTS {} (task_id text PRIMARY KEY,"
         " expires float8 NOT NULL, written float8 NOT NULL)", revoked))]


@dataclass(frozen=True, slots=True)
class _LeaseSQL:
    acquire: sql.Composed
    release: sql.Composed
    lease: sql.Composed


def _lease_sql(le: sql.Identifier) -> _LeaseSQL:
    return _LeaseSQL(
        acquire=sql.SQL(
            "INSERT INTO {le} AS l (name, owner, expires) VALUES (%s, %s, {now} + %s)"
            " ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner,"
            " expires = EXCLUDED.expires WHERE l.owner = EXCLUDED.owner OR l.expires <= {now}"
            " RETURNING 1").format(le=le, now=NOW),
        release=sql.SQL("DELETE FROM {} WHERE name = %s AND owner = %s").format(le),
        lease=sql.SQL("SELECT owner, expires FROM {} WHERE name = %s AND"
                      " expires > {now}").format(le, now=NOW),
    )


@dataclass(frozen=True, slots=True)
class _BucketSQL:
    take: sql.Composed
    create: sql.Composed
    """A full bucket, unless it exists."""


def _bucket_sql(b: sql.Identifier) -> _BucketSQL:
    avail = sql.SQL("least(%(cap)s, tokens + greatest(0, {now} - stamp) * %(rate)s)"
                    ).format(now=NOW)
    take = sql.SQL("greatest(0, least(%(want)s, floor({a} + 1e-9)))::int").format(a=avail)
    return _BucketSQL(
        take=sql.SQL(
            "UPDATE {b} SET granted = {take}, tokens = greatest(0, {a} - {take}),"
            " stamp = greatest(stamp, {now}) WHERE name = %(name)s RETURNING granted, tokens"
        ).format(b=b, take=take, a=avail, now=NOW),
        create=sql.SQL("INSERT INTO {} (name, tokens, stamp) VALUES "
                       "(%(name)s, %(cap)s, {now}) ON CONFLICT DO NOTHING").format(b, now=NOW),
    )


@dataclass(frozen=True, slots=True)
class _BeatSQL:
    holds: sql.Composed
    """The beat lease's row, locked FOR SHARE while its holder claims."""
    advance: sql.Composed
    record: sql.Composed
    prune: sql.Composed
    last: sql.Composed
    runs: sql.Composed
    entries: sql.Composed
    put: sql.Composed
    remove: sql.Composed
    remove_last: sql.Composed


def _beat_sql(le: sql.Identifier, entries: sql.Identifier, last: sql.Identifier,
              runs: sql.Identifier) -> _BeatSQL:
    return _BeatSQL(
        holds=sql.SQL("SELECT 1 FROM {} WHERE name = %s AND owner = %s AND"
                      " expires > {now} FOR SHARE").format(le, now=NOW),
        advance=sql.SQL(
            "INSERT INTO {t} AS t (name, due_ms) VALUES (%s, %s) ON CONFLICT (name) DO UPDATE"
            " SET due_ms = EXCLUDED.due_ms WHERE t.due_ms < EXCLUDED.due_ms RETURNING 1"
        ).format(t=last),
        record=sql.SQL("INSERT INTO {} (run_key, name, due_ms, holder) VALUES"
                       " (%s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1").format(runs),
        prune=sql.SQL("DELETE FROM {} WHERE claimed_at < clock_timestamp()"
                      " - make_interval(secs => %s)").format(runs),
        last=sql.SQL("SELECT name, due_ms FROM {}").format(last),
        runs=sql.SQL("SELECT name, due_ms, holder FROM {} ORDER BY claimed_at DESC,"
                     " due_ms DESC LIMIT %s").format(runs),
        entries=sql.SQL("SELECT name, data FROM {}").format(entries),
        put=sql.SQL("INSERT INTO {} (name, data) VALUES (%s, %s) ON CONFLICT (name)"
                    " DO UPDATE SET data = EXCLUDED.data").format(entries),
        remove=sql.SQL("DELETE FROM {} WHERE name = %s").format(entries),
        remove_last=sql.SQL("DELETE FROM {} WHERE name = %s").format(last),
    )


@dataclass(frozen=True, slots=True)
class _RevokedSQL:
    expire: sql.Composed
    revoke: sql.Composed
    version: sql.Composed
    ids: sql.Composed


def _revoked_sql(revoked: sql.Identifier) -> _RevokedSQL:
    return _RevokedSQL(
        expire=sql.SQL("DELETE FROM {} WHERE expires <= %s").format(revoked),
        revoke=sql.SQL(
            "INSERT INTO {t} VALUES (%s, %s, %s) ON CONFLICT (task_id) DO UPDATE SET"
            " expires = greatest({t}.expires, EXCLUDED.expires), written = EXCLUDED.written"
        ).format(t=revoked),
        version=sql.SQL("SELECT count(*), coalesce(max(written), 0) FROM {}").format(revoked),
        ids=sql.SQL("SELECT task_id, expires FROM {} WHERE expires > %s").format(revoked),
    )


class PostgresStore(PostgresFlow, SharedStore):
    kind = "PostgreSQL"

    def __init__(self, url: str, settings: Settings | None = None) -> None:
        super().__init__(url, settings)
        ns, self._conninfo, _ = split_url(url)
        check_namespace(ns, self.safe_url)
        self._timeout = max(2, round(self.settings.broker_connection_timeout))
        self.tables = [f"{ns}_{t}" for t in TABLES]
        le, b, entries, last, runs, revoked = (sql.Identifier(t) for t in self.tables)
        self._ddl = _ddl(le, b, entries, last, runs, revoked)
        self._q_leases = _lease_sql(le)
        self._q_buckets = _bucket_sql(b)
        self._q_beat = _beat_sql(le, entries, last, runs)
        self._q_revoked = _revoked_sql(revoked)
        self._local = threading.local()
        self._conns: list[tuple[int, Conn]] = []
        """Every connection opened (pid, connection): ``close`` closes this process's,
        those of threads that have ended included."""
        self._lock = threading.Lock()
        self._ready = False
        self._claims = 0

    def _conn(self) -> Conn:
        conn: Conn | None = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid() and not conn.closed:
            return conn
        try:
            conn = psycopg.connect(self._conninfo, autocommit=True,
                                   connect_timeout=self._timeout)
        except psycopg.Error as exc:
            raise BrokerUnavailable(f"cannot connect to PostgreSQL at {self.safe_url}: "
                                    f"{exc}") from exc
        self._local.conn, self._local.pid = conn, os.getpid()
        with self._lock:
            self._conns = [(p, c) for p, c in self._conns if not c.closed]
            self._conns.append((os.getpid(), conn))
        return conn

    def _run(self, op: Callable[[Conn], T]) -> T:
        """``op`` on this thread's connection, the tables made first; once more on a
        new connection if this one dropped, or if the tables were dropped under us."""
        for attempt in (1, 2):
            conn = self._conn()
            try:
                if not self._ready:
                    with conn.transaction():
                        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                                     (self.tables[0],))
                        for statement in self._ddl:
                            conn.execute(statement)
                    self._ready = True
                return op(conn)
            except psycopg.OperationalError as exc:
                if not conn.closed or attempt == 2:
                    raise OperationalError(f"PostgreSQL store {self.safe_url}: {exc}") from exc
                logger.warning("lost the connection to %s; reconnecting", self.safe_url)
                self._local.conn = None
            except psycopg.errors.UndefinedTable as exc:
                self._ready = False
                if attempt == 2:
                    raise OperationalError(f"PostgreSQL store {self.safe_url}: {exc}") from exc
            except psycopg.Error as exc:
                raise OperationalError(f"PostgreSQL store {self.safe_url}: {exc}") from exc
        raise AssertionError("unreachable")

    def _rows(self, query: sql.Composed, params: Any = ()) -> list[tuple[Any, ...]]:
        def op(conn: Conn) -> list[tuple[Any, ...]]:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

        return self._run(op)

    # -- leases -------------------------------------------------------------------------
    def acquire(self, name: str, owner: str, ttl: float) -> bool:
        return bool(self._rows(self._q_leases.acquire, (name, owner, ttl)))

    def release(self, name: str, owner: str) -> None:
        self._rows(self._q_leases.release, (name, owner))

    def lease(self, name: str) -> Lease | None:
        rows = self._rows(self._q_leases.lease, (name,))
        return Lease(str(rows[0][0]), float(rows[0][1])) if rows else None

    # -- token buckets ------------------------------------------------------------------
    def take(self, name: str, rate: float, capacity: float, want: int) -> Grant:
        check_args(rate, capacity, want)
        params = {"name": name, "rate": rate, "cap": float(capacity), "want": want}
        rows = self._rows(self._q_buckets.take, params)
        if not rows:  # the first take of this name: a full bucket, then take from it
            self._rows(self._q_buckets.create, params)
            rows = self._rows(self._q_buckets.take, params)
        granted, tokens = int(rows[0][0]), float(rows[0][1])
        return Grant(granted, wait_for(granted, want, tokens, rate, capacity))

    # -- beat ---------------------------------------------------------------------------
    def _claim(self, holder: str, name: str, due_ms: int, record: bool) -> bool:
        def op(conn: Conn) -> bool:
            try:
                with conn.transaction():
                    if conn.execute(self._q_beat.holds, (BEAT_LEASE, holder)).fetchone() is None:
                        raise _Rollback
                    if conn.execute(self._q_beat.advance, (name, due_ms)).fetchone() is None:
                        raise _Rollback
                    if record and conn.execute(
                            self._q_beat.record, (run_key(name, due_ms), name, due_ms, holder)
                    ).fetchone() is None:
                        raise _Rollback
            except _Rollback:
                return False
            return True

        claimed = self._run(op)
        self._claims += 1
        if self._claims % PRUNE_EVERY == 0:
            self._rows(self._q_beat.prune, (RUN_KEY_TTL,))
        return claimed

    def claim(self, holder: str, name: str, due_ms: int) -> bool:
        return self._claim(holder, name, due_ms, True)

    def advance(self, holder: str, name: str, due_ms: int) -> bool:
        return self._claim(holder, name, due_ms, False)

    def last_runs(self) -> dict[str, int]:
        return {str(n): int(d) for n, d in self._rows(self._q_beat.last)}

    def runs(self, limit: int = LEDGER_LENGTH) -> list[Run]:
        return [Run(n, int(d), h) for n, d, h in self._rows(self._q_beat.runs, (limit,))]

    def entries(self) -> dict[str, bytes]:
        return {str(n): str(d).encode() for n, d in self._rows(self._q_beat.entries)}

    def put_entry(self, name: str, data: bytes) -> None:
        self._rows(self._q_beat.put, (name, data.decode()))

    def remove_entry(self, name: str) -> bool:
        def op(conn: Conn) -> bool:
            with conn.transaction():
                conn.execute(self._q_beat.remove_last, (name,))
                return conn.execute(self._q_beat.remove, (name,)).rowcount == 1

        return self._run(op)

    # -- revoked ids --------------------------------------------------------------------
    def revoke(self, ids: Sequence[str], expires_at: float) -> None:
        now = time.time()

        def op(conn: Conn) -> None:
            conn.execute(self._q_revoked.expire, (now,))
            with conn.cursor() as cur:
                cur.executemany(self._q_revoked.revoke, [(i, expires_at, now) for i in ids])

        self._run(op)

    def revoked_version(self) -> object:
        return tuple(self._rows(self._q_revoked.version)[0])

    def revoked(self) -> dict[str, float]:
        return {str(k): float(v) for k, v in self._rows(self._q_revoked.ids, (time.time(),))}

    # -- administration -----------------------------------------------------------------
    def drop(self) -> None:
        """Delete this namespace's store tables (tests)."""
        def op(conn: Conn) -> None:
            for table in self.tables:
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))

        self._run(op)
        self._ready = False

    def close(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
        for pid, conn in conns:
            if pid == os.getpid():  # a forked child must not end its parent's sessions
                conn.close()
        self._local = threading.local()
