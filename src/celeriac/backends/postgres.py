"""Results in PostgreSQL: one table per namespace, writes announced by NOTIFY.

URL: ``postgresql://user:pw@host:5432/db?namespace=celeriac`` (``postgres://`` too). The
``namespace`` parameter names the table and is stripped before connecting; every other
parameter goes to libpq. Schema, created on first use::

    <ns>_results(task_id text PRIMARY KEY, seq bigint (from <ns>_results_seq),
                 content_type text, data bytea, expires double precision)
    + indexes on seq and on expires

``expires`` is unix time (NULL: never); readers ignore expired rows, ``cleanup`` deletes
them. Every write takes a new ``seq`` and NOTIFYs the channel ``<ns>_results`` in the same
transaction, so ``wait_for`` reads only the rows past its cursor and sleeps on a LISTEN
connection until something is written, instead of polling.

Writers hold a transaction-level advisory lock from ``nextval`` to commit. Without it two
writers could commit out of ``seq`` order, and a reader whose cursor had already passed the
later ``seq`` would never see the earlier row. PostgreSQL already serializes the commits
of transactions that NOTIFY, so the lock adds little beyond the upsert itself.

Chords (``chord_part``), in two more tables, created (under the same advisory lock) on
the first ``chord_part`` rather than with the results table, so that deployments and test
namespaces that never run a chord do not get tables they would have to drop::

    <ns>_chords(group_id text PRIMARY KEY, fired_by text, expires double precision)
    <ns>_chord_parts(group_id text REFERENCES <ns>_chords ON DELETE CASCADE,
                     task_id text, PRIMARY KEY (group_id, task_id))

``chord_part`` is one transaction that first locks the chord's row (SELECT ... FOR
UPDATE): callers on one chord run one after the other, and each one's count, a new
snapshot taken after it got the lock, includes every part committed before it. So
exactly one of them sees the count reach the size with ``fired_by`` still null. An expired
chord is deleted with its parts (the cascade) by the next ``chord_part`` on it, which
starts over, or by ``cleanup``.

Connections are per thread and per process: a forked child opens its own and never closes
its parent's (that would end the parent's session). LISTEN connections of threads that
died, or that have not waited for a while, are closed: a listener that stops reading
holds back PostgreSQL's shared notification queue until it fills.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import re
import select
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql

from ..clients.net import mask_password
from ..errors import BrokerUnavailable, ConfigurationError, OperationalError
from .base import ResultBackend, Stored

if TYPE_CHECKING:
    from ..settings import Settings

log = logging.getLogger("celeriac.backends.postgres")

T = TypeVar("T")
Conn = psycopg.Connection[tuple[Any, ...]]

DEFAULT_NAMESPACE = "celeriac"
# Room for the longest derived name, "<ns>_results_expires_idx", in PostgreSQL's 63 bytes
# (longer identifiers are silently truncated, and two namespaces could then collide).
_NAMESPACE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,42}")
LISTENER_IDLE = 60.0
"""A thread's LISTEN connection unused this long (seconds) is closed."""
REAP_EVERY = 10.0
MAX_PAYLOAD = 7999  # NOTIFY's payload limit is 8000 bytes; the payload is informative only


mask_url = mask_password
"""``url`` with any password replaced by ``***`` (for messages and logs)."""


def _reason(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__  # libpq's text spans lines


class _Listener:
    """One thread's LISTEN connection.

    ``pending`` records a notification received since the last ``drain``, so one that
    arrives between a read and the following wait is kept, not lost.
    """

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self.lock = threading.Lock()  # the reaper may close it from another thread
        self.pending = False
        self.used = time.monotonic()

    @property
    def closed(self) -> bool:
        return self.conn.closed

    def _receive(self) -> bool:
        # libpq's own non-blocking read; notifications never come any other way here, as
        # this connection runs no queries after LISTEN.
        pgconn = self.conn.pgconn
        pgconn.consume_input()
        while pgconn.notifies() is not None:
            self.pending = True
        return self.pending

    def drain(self) -> None:
        """Forget what arrived so far: the read that follows covers it."""
        with self.lock:
            if not self.conn.closed:
                self._receive()
            self.pending, self.used = False, time.monotonic()

    def wait(self, timeout: float) -> None:
        with self.lock:
            deadline = time.monotonic() + timeout
            while not self.conn.closed and not self._receive():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                # Sleep in the kernel until the server sends something: no timer poll.
                select.select([self.conn.pgconn.socket], [], [], remaining)
            self.used = time.monotonic()


class _ThreadState:
    def __init__(self) -> None:
        self.thread = threading.current_thread()
        self.pid = os.getpid()
        self.conn: Conn | None = None
        self.listener: _Listener | None = None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        if self.listener is not None:
            self.listener.conn.close()
        self.conn = self.listener = None


def split_url(url: str) -> tuple[str, str, dict[str, str]]:
    """A PostgreSQL URL's ``namespace`` parameter (the default when absent; unchecked),
    the libpq connection string without it, and the parameters that remain."""
    parts = urlsplit(url)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    namespace = dict(pairs).get("namespace", DEFAULT_NAMESPACE)
    rest = [(k, v) for k, v in pairs if k != "namespace"]
    return namespace, urlunsplit(parts._replace(query=urlencode(rest))), dict(rest)


def check_namespace(namespace: str, where: str) -> None:
    """Refuse a namespace that cannot prefix our table names (``where``: the URL, as the
    message names it)."""
    if not _NAMESPACE.fullmatch(namespace):
        raise ConfigurationError(f"unsafe namespace {namespace!r} in {where}: use 1-43 "
                                 "letters, digits or '_', not starting with a digit")


@dataclass(frozen=True, slots=True)
class _ResultsSQL:
    """The results table's statements."""

    ddl: list[sql.Composed]
    upsert: sql.Composed
    get: sql.Composed
    cursor: sql.Composed
    changes: sql.Composed
    forget: sql.Composed
    cleanup: sql.Composed
    listen: sql.Composed


def _results_sql(table: str) -> _ResultsSQL:
    t, seq = sql.Identifier(table), sql.Identifier(f"{table}_seq")
    seq_name = sql.Literal(f'"{table}_seq"')  # nextval() parses its text argument
    return _ResultsSQL(
        ddl=[
            sql.SQL("CREATE SEQUENCE IF NOT EXISTS {}").format(seq),
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (task_id text PRIMARY KEY,"
                    " seq bigint NOT NULL DEFAULT nextval({}), content_type text NOT NULL,"
                    " data bytea NOT NULL, expires double precision)").format(t, seq_name),
            # Owned by the column: dropping the table drops the sequence too.
            sql.SQL("ALTER SEQUENCE {} OWNED BY {}.seq").format(seq, t),
            sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (seq)").format(
                sql.Identifier(f"{table}_seq_idx"), t),
            sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (expires) WHERE expires IS NOT NULL"
                    ).format(sql.Identifier(f"{table}_expires_idx"), t),
        ],
        # One nextval per write, in VALUES, so a conflicting insert wastes none.
        upsert=sql.SQL(
            "INSERT INTO {t} (task_id, seq, content_type, data, expires)"
            " VALUES (%s, nextval({s}), %s, %s, %s) ON CONFLICT (task_id) DO UPDATE SET"
            " seq = EXCLUDED.seq, content_type = EXCLUDED.content_type,"
            " data = EXCLUDED.data, expires = EXCLUDED.expires").format(t=t, s=seq_name),
        get=sql.SQL("SELECT task_id, content_type, data FROM {} WHERE task_id = ANY(%s)"
                    " AND (expires IS NULL OR expires > %s)").format(t),
        cursor=sql.SQL("SELECT coalesce(max(seq), 0) FROM {}").format(t),
        changes=sql.SQL("SELECT seq, task_id FROM {} WHERE seq > %s ORDER BY seq").format(t),
        forget=sql.SQL("DELETE FROM {} WHERE task_id = %s").format(t),
        cleanup=sql.SQL("DELETE FROM {} WHERE expires <= %s").format(t),
        listen=sql.SQL("LISTEN {}").format(t),
    )


@dataclass(frozen=True, slots=True)
class _ChordSQL:
    """The chord tables' names and statements."""

    tables: tuple[str, str]
    ddl: list[sql.Composed]
    row: sql.Composed
    lock: sql.Composed
    reset: sql.Composed
    touch: sql.Composed
    part: sql.Composed
    fire: sql.Composed
    firer: sql.Composed
    cleanup: sql.Composed


def _chord_sql(namespace: str) -> _ChordSQL:
    chords, parts = f"{namespace}_chords", f"{namespace}_chord_parts"
    ct, pt = sql.Identifier(chords), sql.Identifier(parts)
    return _ChordSQL(
        tables=(chords, parts),
        ddl=[
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (group_id text PRIMARY KEY,"
                    " fired_by text, expires double precision)"
                    ).format(ct),
            sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (expires) WHERE expires IS NOT NULL"
                    ).format(sql.Identifier(f"{namespace}_chords_expires_idx"), ct),
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (group_id text NOT NULL REFERENCES {}"
                    " ON DELETE CASCADE, task_id text NOT NULL,"
                    " PRIMARY KEY (group_id, task_id))").format(pt, ct),
        ],
        row=sql.SQL("INSERT INTO {} (group_id, fired_by, expires) VALUES (%s, NULL, %s)"
                    " ON CONFLICT (group_id) DO NOTHING").format(ct),
        lock=sql.SQL("SELECT expires FROM {} WHERE group_id = %s FOR UPDATE").format(ct),
        reset=sql.SQL("DELETE FROM {} WHERE group_id = %s").format(pt),
        touch=sql.SQL(
            "UPDATE {} SET expires = %s,"
            " fired_by = CASE WHEN %s THEN NULL ELSE fired_by END WHERE group_id = %s"
        ).format(ct),
        part=sql.SQL("INSERT INTO {} (group_id, task_id) VALUES (%s, %s)"
                     " ON CONFLICT DO NOTHING").format(pt),
        fire=sql.SQL(
            "UPDATE {c} SET fired_by = %s WHERE group_id = %s AND fired_by IS NULL AND"
            " (SELECT count(*) FROM {p} WHERE group_id = %s) >= %s RETURNING 1"
        ).format(c=ct, p=pt),
        firer=sql.SQL("SELECT fired_by FROM {} WHERE group_id = %s").format(ct),
        cleanup=sql.SQL("DELETE FROM {} WHERE expires <= %s").format(ct),  # parts: cascade
    )


class PostgresBackend(ResultBackend):
    scheme = "postgresql"

    def __init__(self, url: str, settings: Settings) -> None:
        super().__init__(url, settings)
        self.safe_url = mask_url(url)
        namespace, self._conninfo, params = split_url(url)
        check_namespace(namespace, f"result backend URL {self.safe_url}")
        self._connect_kwargs: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in params:
            self._connect_kwargs["connect_timeout"] = max(
                2, math.ceil(settings.broker_connection_timeout))
        self.table = f"{namespace}_results"
        self._lock_key = int.from_bytes(
            hashlib.blake2b(f"celeriac:{self.table}".encode(), digest_size=8).digest(),
            "big", signed=True)
        self._sql = _results_sql(self.table)
        self._chord_sql = _chord_sql(namespace)
        self._pipeline = psycopg.Pipeline.is_supported()
        self._local = threading.local()
        self._states: list[_ThreadState] = []
        self._guard = threading.Lock()
        self._schema_ready = False
        self._chord_schema_ready = False
        self._next_reap = time.monotonic() + REAP_EVERY

    # -- connections ------------------------------------------------------------------
    def _connect(self) -> Conn:
        try:
            return psycopg.connect(self._conninfo, **self._connect_kwargs)
        except psycopg.Error as exc:
            raise BrokerUnavailable(f"cannot connect to the PostgreSQL result backend "
                                    f"{self.safe_url}: {_reason(exc)}") from exc

    def _state(self) -> _ThreadState:
        state: _ThreadState | None = getattr(self._local, "state", None)
        if state is None or state.pid != os.getpid():
            state = self._local.state = _ThreadState()
            with self._guard:
                self._states.append(state)
        if time.monotonic() >= self._next_reap:
            self._reap()
        return state

    def _reap(self) -> None:
        now, pid = time.monotonic(), os.getpid()
        self._next_reap = now + REAP_EVERY
        with self._guard:
            dead = [s for s in self._states if s.pid == pid and not s.thread.is_alive()]
            self._states = [s for s in self._states if s not in dead]
            idle = [s.listener for s in self._states if s.pid == pid and s.listener
                    and now - s.listener.used > LISTENER_IDLE]
        for state in dead:
            state.close()
        for listener in idle:
            # The owner holds the lock while it waits; it notices the close and listens
            # again on its next wait.
            if listener.lock.acquire(blocking=False):
                try:
                    listener.conn.close()
                finally:
                    listener.lock.release()
        if dead or idle:
            log.debug("closed connections of %d ended threads, %d idle listeners",
                      len(dead), len(idle))

    def _create_schema(self, conn: Conn) -> None:
        row = conn.execute("SELECT to_regclass(%s)", (f'"{self.table}"',)).fetchone()
        if row is None or row[0] is None:
            # The lock serializes processes racing to create it: concurrent CREATE ... IF
            # NOT EXISTS can still fail on the catalog's unique indexes.
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (self._lock_key,))
                for statement in self._sql.ddl:
                    conn.execute(statement)
            log.info("result table %s ready in %s", self.table, self.safe_url)
        self._schema_ready = True

    def _chord_tables_exist(self, conn: Conn) -> bool:
        row = conn.execute("SELECT to_regclass(%s)",
                           (f'"{self._chord_sql.tables[1]}"',)).fetchone()
        return row is not None and row[0] is not None

    def _create_chord_schema(self, conn: Conn) -> None:
        # The parts table is created last: once it exists, both do.
        if not self._chord_tables_exist(conn):
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (self._lock_key,))
                for statement in self._chord_sql.ddl:
                    conn.execute(statement)
            log.info("chord tables %s ready in %s", ", ".join(self._chord_sql.tables),
                     self.safe_url)
        self._chord_schema_ready = True

    def _run(self, op: Callable[[Conn], T]) -> T:
        """``op`` on this thread's connection; a lost connection is re-opened once.

        Every statement here may be repeated safely: a write whose commit went unconfirmed
        is written again.
        """
        for attempt in (1, 2):
            state = self._state()
            if state.conn is None or state.conn.closed:
                state.conn = self._connect()
            conn = state.conn
            try:
                if not self._schema_ready:
                    self._create_schema(conn)
                return op(conn)
            except psycopg.errors.UndefinedTable:
                # Dropped under us (a reset database).
                self._schema_ready = self._chord_schema_ready = False
                if attempt == 2:
                    raise
            except psycopg.OperationalError as exc:
                if not conn.closed:
                    raise OperationalError(f"PostgreSQL result backend {self.safe_url}: "
                                           f"{_reason(exc)}") from exc
                conn.close()
                state.conn = None
                if attempt == 2:
                    raise BrokerUnavailable(f"lost the connection to the PostgreSQL result "
                                            f"backend {self.safe_url}: {_reason(exc)}") from exc
                log.warning("lost the connection to %s (%s); reconnecting", self.safe_url,
                            _reason(exc))
            except psycopg.Error as exc:
                raise OperationalError(f"PostgreSQL result backend {self.safe_url}: "
                                       f"{_reason(exc)}") from exc
        raise AssertionError("unreachable")

    def _listen(self) -> _Listener:
        conn = self._connect()
        try:
            conn.execute(self._sql.listen)
        except psycopg.Error as exc:
            conn.close()
            raise BrokerUnavailable(f"cannot LISTEN on the PostgreSQL result backend "
                                    f"{self.safe_url}: {_reason(exc)}") from exc
        return _Listener(conn)

    def _drain(self, create: bool = False) -> None:
        # Only wait_for (through _cursor) starts listening: threads that merely read a
        # state should not hold a second connection.
        state = self._state()
        if state.listener is None or state.listener.closed:
            if not create:
                return
            state.listener = self._listen()
        try:
            state.listener.drain()
        except psycopg.Error as exc:
            log.warning("LISTEN connection to %s failed: %s", self.safe_url, _reason(exc))
            state.listener.conn.close()  # the next _wait listens again and returns at once

    # -- the backend ------------------------------------------------------------------
    def store_many(self, items: Sequence[Stored]) -> None:
        if not items:
            return
        # The payload is informative only (waiters read the change feed): the one id of a
        # single store, nothing for a batch.
        task_id = items[0].task_id if len(items) == 1 else ""
        payload = task_id if len(task_id.encode()) <= MAX_PAYLOAD else ""
        # Sorted: two batches upserting the same ids in different orders could deadlock
        # (the advisory lock makes that moot today, but the order costs nothing).
        rows = sorted({item.task_id: item for item in items}.values())

        def op(conn: Conn) -> None:
            # Pipelined: lock, upserts, notify and commit travel in one round trip, so the
            # lock is held only for the server's work.
            with conn.pipeline() if self._pipeline else contextlib.nullcontext(), \
                    conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (self._lock_key,))
                with conn.cursor() as cur:
                    cur.executemany(self._sql.upsert, rows)
                conn.execute("SELECT pg_notify(%s, %s)", (self.table, payload))

        self._run(op)

    def _get(self, task_ids: Sequence[str]) -> dict[str, tuple[str, bytes]]:
        if not task_ids:
            return {}
        # Drain before reading: a result written after this read still wakes _wait.
        self._drain()
        rows = self._run(lambda conn: conn.execute(
            self._sql.get, (list(task_ids), time.time()), binary=True).fetchall())
        return {tid: (ct, bytes(data)) for tid, ct, data in rows}

    def _cursor(self) -> int:
        self._drain(create=True)  # LISTEN before the first read of a wait_for
        row = self._run(lambda conn: conn.execute(self._sql.cursor).fetchone())
        return int(row[0]) if row else 0

    def _changes(self, cursor: int) -> tuple[int, list[str]]:
        self._drain()
        rows = self._run(lambda conn: conn.execute(self._sql.changes, (cursor,)).fetchall())
        return (int(rows[-1][0]) if rows else cursor), [r[1] for r in rows]

    def _wait(self, timeout: float) -> None:
        state = self._state()
        if state.listener is None or state.listener.closed:
            # Listening only now: a write since the last read may have gone unannounced,
            # so return for a read rather than sleep through it.
            state.listener = self._listen()
            return
        try:
            state.listener.wait(timeout)
        except (psycopg.Error, OSError) as exc:  # OSError: close() from another thread
            log.warning("LISTEN connection to %s failed: %s", self.safe_url, _reason(exc))
            state.listener.conn.close()

    def forget(self, task_id: str) -> None:
        self._run(lambda conn: conn.execute(self._sql.forget, (task_id,)))

    def chord_part(self, group_id: str, task_id: str, size: int) -> bool:
        expires = self.settings.result_expires

        def op(conn: Conn) -> bool:
            if not self._chord_schema_ready:
                self._create_chord_schema(conn)
            now = time.time()
            expires_at = now + expires if expires else None
            with conn.transaction():
                # READ COMMITTED whatever the server's default: each statement's snapshot
                # is taken when it starts, which the count below relies on.
                conn.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
                # The row first (a concurrent first caller's uncommitted insert makes this
                # one wait for it), then its lock: from here to commit, no other call on
                # this chord runs, and the count below, a snapshot taken after the lock
                # was granted, sees every part committed by the calls before.
                conn.execute(self._chord_sql.row, (group_id, expires_at))
                row = conn.execute(self._chord_sql.lock, (group_id,)).fetchone()
                expired = row is not None and row[0] is not None and row[0] <= now
                if expired:  # cleanup has not run yet: this count starts over
                    conn.execute(self._chord_sql.reset, (group_id,))
                conn.execute(self._chord_sql.touch, (expires_at, expired, group_id))
                conn.execute(self._chord_sql.part, (group_id, task_id))
                # RETURNING a row only for the call that sets the flag at the full count;
                # the completing task run again (it may have died before sending the body)
                # finds its own id there.
                if conn.execute(self._chord_sql.fire, (task_id, group_id, group_id, size)
                                ).fetchone() is not None:
                    return True
                firer = conn.execute(self._chord_sql.firer, (group_id,)).fetchone()
                return firer is not None and firer[0] == task_id

        return self._run(op)

    def cleanup(self) -> int:
        now = time.time()

        def clean_chords(conn: Conn) -> None:
            # The tables may be another process's (the one that ran the chords).
            if not self._chord_schema_ready:
                if not self._chord_tables_exist(conn):
                    return
                self._chord_schema_ready = True
            conn.execute(self._chord_sql.cleanup, (now,))

        self._run(clean_chords)
        deleted = self._run(lambda conn: conn.execute(self._sql.cleanup, (now,)).rowcount)
        if deleted:
            log.debug("deleted %d expired results from %s", deleted, self.table)
        return deleted

    def close(self) -> None:
        pid = os.getpid()
        with self._guard:
            mine = [s for s in self._states if s.pid == pid]
            # A parent's connections stay referenced and open: closing (or collecting)
            # them here would end the parent's sessions.
            self._states = [s for s in self._states if s.pid != pid]
        for state in mine:
            state.close()
        self._local = threading.local()
