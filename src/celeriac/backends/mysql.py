"""Results in MySQL or MariaDB (celeriac's layout), on PyMySQL.

URL: ``mysql://user:pw@host:3306/db?namespace=celeriac``. ``namespace`` prefixes the
table names, as on PostgreSQL. Schema (InnoDB, ids compared byte for byte), created on
first use::

    <ns>_results(task_id varchar(255) PRIMARY KEY, seq bigint, content_type varchar(255),
                 data longblob, expires double)       + indexes on seq and on expires
    <ns>_results_seq(id tinyint PRIMARY KEY, n bigint)   -- one row: the write counter
    <ns>_chords(group_id varchar(255) PRIMARY KEY, fired_by varchar(255), expires double)
    <ns>_chord_parts(group_id, task_id, PRIMARY KEY (group_id, task_id),
                     FOREIGN KEY (group_id) REFERENCES <ns>_chords ON DELETE CASCADE)

The guarantees are the PostgreSQL backend's (``postgres.py``), by other means:

- **Writes in order.** A write transaction first bumps the counter row
  (``UPDATE ... SET n = LAST_INSERT_ID(n + k)``), whose row lock it holds to its commit,
  so writers commit one after the other in ``seq`` order: a reader's cursor never passes a
  row that commits later with a smaller ``seq``.
- **Waits.** MySQL has no LISTEN/NOTIFY: a waiter reads the counter row every
  ``POLL`` seconds (one primary-key read) and wakes when it moved past what the waiter
  saw before its last read of the results, so nothing written between a read and the
  sleep is missed; ``wait_for`` then reads only the rows past its cursor.
- **Chords exactly once.** ``chord_part`` is one READ COMMITTED transaction that first
  takes the chord row's exclusive lock (``INSERT ... ON DUPLICATE KEY UPDATE`` locks the
  existing row exclusively, so no two callers hold a shared lock and deadlock upgrading
  it), then counts: callers on one chord run one after the other and exactly one sees the
  count reach the size with ``fired_by`` still empty. A deadlock or lock timeout that
  InnoDB reports anyway rolls the transaction back and it runs again (it is idempotent).
- **Expiry.** ``expires`` is unix time (NULL: never); readers skip expired rows and
  ``cleanup`` deletes them, and expired chords with their parts.

Connections are per thread and per process (a forked child opens its own and never uses
its parent's socket), autocommit, READ COMMITTED.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

import pymysql
import pymysql.err

from ..clients.net import mask_password
from ..errors import BrokerUnavailable, ConfigurationError, OperationalError
from .base import ResultBackend, Stored

if TYPE_CHECKING:
    from ..settings import Settings

log = logging.getLogger("celeriac.backends.mysql")

T = TypeVar("T")
DEFAULT_NAMESPACE = "celeriac"
# The longest derived name, "<ns>_results_expires_idx", within MySQL's 64 characters.
_NAMESPACE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,43}")
POLL = 0.05
"""Seconds between two looks at the write counter while a waiter sleeps."""
_RETRIED = (1213, 1205)  # deadlock found; lock wait timeout: InnoDB rolled it back
_LOST = (2006, 2013, 2014, 2055)  # server gone, connection lost, out of sync, lost (ssl)
_BIN = "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"


def _ddl(ns: str) -> list[str]:
    r, s, c, p = (f"`{ns}_results`", f"`{ns}_results_seq`", f"`{ns}_chords`",
                  f"`{ns}_chord_parts`")
    return [
        f"CREATE TABLE IF NOT EXISTS {r} (task_id varchar(255) {_BIN} NOT NULL PRIMARY KEY,"
        " seq bigint NOT NULL, content_type varchar(255) NOT NULL, data longblob NOT NULL,"
        f" expires double NULL, KEY `{ns}_results_seq_idx` (seq),"
        f" KEY `{ns}_results_expires_idx` (expires)) ENGINE=InnoDB",
        f"CREATE TABLE IF NOT EXISTS {s} (id tinyint NOT NULL PRIMARY KEY,"
        " n bigint NOT NULL) ENGINE=InnoDB",
        f"INSERT IGNORE INTO {s} (id, n) VALUES (1, 0)",
        f"CREATE TABLE IF NOT EXISTS {c} (group_id varchar(255) {_BIN} NOT NULL PRIMARY KEY,"
        f" fired_by varchar(255) {_BIN} NULL, expires double NULL,"
        f" KEY `{ns}_chords_expires_idx` (expires)) ENGINE=InnoDB",
        f"CREATE TABLE IF NOT EXISTS {p} (group_id varchar(255) {_BIN} NOT NULL,"
        f" task_id varchar(255) {_BIN} NOT NULL, PRIMARY KEY (group_id, task_id),"
        f" FOREIGN KEY (group_id) REFERENCES {c} (group_id) ON DELETE CASCADE"
        ") ENGINE=InnoDB",
    ]


def parse_url(url: str) -> tuple[str, dict[str, Any]]:
    """A ``mysql://`` URL's namespace and PyMySQL's connection arguments."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    database = unquote(parts.path.lstrip("/"))
    if not database:
        raise ConfigurationError(f"result backend URL {mask_password(url)} names no "
                                 "database: mysql://user:password@host:3306/<database>")
    kwargs: dict[str, Any] = {
        "host": parts.hostname or "127.0.0.1", "port": parts.port or 3306,
        "user": unquote(parts.username or "root"), "password": unquote(parts.password or ""),
        "database": database}
    if "unix_socket" in query:
        kwargs["unix_socket"] = query["unix_socket"]
    return query.get("namespace", DEFAULT_NAMESPACE), kwargs


def _expiry(item: Stored, lifetime: float) -> float | None:
    """When ``item`` expires: ``lifetime`` (now + ``result_expires``), or never."""
    return None if item.expires_at is None else max(item.expires_at, lifetime)


class _ThreadState:
    def __init__(self) -> None:
        self.thread = threading.current_thread()
        self.pid = os.getpid()
        self.conn: Any = None
        self.seen = -1
        """The counter as read just before this thread's last read of results."""

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(pymysql.err.Error):  # already gone
                self.conn.close()
        self.conn = None


class MySQLBackend(ResultBackend):
    scheme = "mysql"

    def __init__(self, url: str, settings: Settings) -> None:
        super().__init__(url, settings)
        self.safe_url = mask_password(url)
        namespace, self._connect_kwargs = parse_url(url)
        if not _NAMESPACE.fullmatch(namespace):
            raise ConfigurationError(f"unsafe namespace {namespace!r} in result backend URL "
                                     f"{self.safe_url}: use 1-44 letters, digits or '_', "
                                     "not starting with a digit")
        self.namespace = namespace
        self._connect_kwargs.update(
            autocommit=True, charset="utf8mb4",
            connect_timeout=max(2, round(settings.broker_connection_timeout)),
            init_command="SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        t = {name: f"`{namespace}_{name}`" for name in
             ("results", "results_seq", "chords", "chord_parts")}
        self._t = t
        self._local = threading.local()
        self._states: list[_ThreadState] = []
        self._guard = threading.Lock()
        self._schema_ready = False

    # -- connections ------------------------------------------------------------------
    def _state(self) -> _ThreadState:
        state: _ThreadState | None = getattr(self._local, "state", None)
        if state is None or state.pid != os.getpid():
            state = self._local.state = _ThreadState()
            with self._guard:
                pid = os.getpid()
                dead = [s for s in self._states if s.pid == pid and not s.thread.is_alive()]
                self._states = [s for s in self._states if s not in dead]
                self._states.append(state)
            for old in dead:
                old.close()
        return state

    def _connect(self) -> Any:
        try:
            conn = pymysql.connect(**self._connect_kwargs)
        except pymysql.err.Error as exc:
            raise BrokerUnavailable(f"cannot connect to the MySQL result backend "
                                    f"{self.safe_url}: {exc}") from exc
        if not self._schema_ready:
            try:
                self._create_schema(conn)
            except pymysql.err.Error as exc:
                with contextlib.suppress(pymysql.err.Error):
                    conn.close()
                raise OperationalError(f"MySQL result backend {self.safe_url}: cannot make "
                                       f"its tables: {exc}") from exc
        return conn

    def _create_schema(self, conn: Any) -> None:
        if not self._schema_ready:
            with conn.cursor() as cur:
                # Looked up first: a CREATE ... IF NOT EXISTS still costs a metadata lock.
                cur.execute("SELECT count(*) FROM information_schema.tables WHERE "
                            "table_schema = DATABASE() AND table_name IN (%s, %s, %s, %s)",
                            [name.strip("`") for name in self._t.values()])
                if int(cur.fetchone()[0]) < len(self._t):
                    for statement in _ddl(self.namespace):
                        cur.execute(statement)
                    log.info("result tables %s_* ready in %s", self.namespace, self.safe_url)
            self._schema_ready = True

    def _run(self, op: Callable[[Any], T]) -> T:
        """``op(cursor)`` on this thread's connection; a lost connection is opened again
        and a rolled-back deadlock retried: every operation here may be repeated."""
        for attempt in range(1, 4):
            state = self._state()
            if state.conn is None:
                state.conn = self._connect()
            try:
                with state.conn.cursor() as cur:
                    return op(cur)
            except pymysql.err.Error as exc:
                code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else 0
                self._recover(state, code)
                if code == 1146:  # a table dropped under us (a reset database)
                    self._schema_ready = False
                if attempt == 3 or code not in (*_RETRIED, *_LOST, 1146):
                    kind = BrokerUnavailable if code in _LOST else OperationalError
                    raise kind(f"MySQL result backend {self.safe_url}: {exc}") from exc
                log.warning("MySQL result backend %s: %s; trying again", self.safe_url, exc)
        raise AssertionError("unreachable")

    @staticmethod
    def _recover(state: _ThreadState, code: int) -> None:
        if code in _LOST or code == 1146:
            state.close()
            return
        try:
            state.conn.rollback()  # a transaction cut short must not linger
        except pymysql.err.Error:
            state.close()

    # -- the backend ------------------------------------------------------------------
    def store_many(self, items: Sequence[Stored]) -> None:
        if not items:
            return
        rows = sorted({item.task_id: item for item in items}.values())
        t = self._t

        def op(cur: Any) -> None:
            # Lifetimes count from the write (after a first connection's DDL, which a
            # loaded server may take a while over), as the results' own setting says.
            lifetime = time.time() + (self.settings.result_expires or 0)
            cur.execute("BEGIN")
            try:
                # The counter's row lock, held to the commit, orders writers by seq.
                cur.execute(f"UPDATE {t['results_seq']} SET n = LAST_INSERT_ID(n + %s) "
                            "WHERE id = 1", (len(rows),))
                top = int(cur.lastrowid)
                first = top - len(rows) + 1
                cur.executemany(
                    f"INSERT INTO {t['results']} (task_id, seq, content_type, data, expires)"
                    " VALUES (%s, %s, %s, %s, %s) ON DUPLICATE KEY UPDATE seq = VALUES(seq),"
                    " content_type = VALUES(content_type), data = VALUES(data),"
                    " expires = VALUES(expires)",
                    [(r.task_id, first + n, r.content_type, r.data, _expiry(r, lifetime))
                     for n, r in enumerate(rows)])
                cur.execute("COMMIT")
            except BaseException:
                cur.connection.rollback()
                raise

        self._run(op)

    def _get(self, task_ids: Sequence[str]) -> dict[str, tuple[str, bytes]]:
        if not task_ids:
            return {}
        state = self._state()
        ids = list(dict.fromkeys(task_ids))

        def op(cur: Any) -> list[tuple[Any, ...]]:
            # The counter first: a write committed after it moves it past what we saw.
            state.seen = self._counter(cur)
            marks = ", ".join(["%s"] * len(ids))
            cur.execute(f"SELECT task_id, content_type, data FROM {self._t['results']} "
                        f"WHERE task_id IN ({marks}) AND (expires IS NULL OR expires > %s)",
                        (*ids, time.time()))
            return list(cur.fetchall())

        return {tid: (ct, bytes(data)) for tid, ct, data in self._run(op)}

    def _counter(self, cur: Any) -> int:
        cur.execute(f"SELECT n FROM {self._t['results_seq']} WHERE id = 1")
        row = cur.fetchone()
        return int(row[0]) if row else 0

    def _cursor(self) -> int:
        state = self._state()

        def op(cur: Any) -> int:
            state.seen = self._counter(cur)
            return state.seen

        return self._run(op)

    def _changes(self, cursor: int) -> tuple[int, list[str]]:
        state = self._state()

        def op(cur: Any) -> list[tuple[Any, ...]]:
            state.seen = self._counter(cur)
            cur.execute(f"SELECT seq, task_id FROM {self._t['results']} WHERE seq > %s "
                        "ORDER BY seq", (cursor,))
            return list(cur.fetchall())

        rows = self._run(op)
        return (int(rows[-1][0]) if rows else cursor), [r[1] for r in rows]

    def _wait(self, timeout: float) -> None:
        state = self._state()
        deadline = time.monotonic() + timeout
        while True:
            now = self._run(self._counter)
            if now > state.seen:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            time.sleep(min(POLL, remaining))  # no notifications in MySQL: a cheap poll

    def forget(self, task_id: str) -> None:
        self._run(lambda cur: cur.execute(
            f"DELETE FROM {self._t['results']} WHERE task_id = %s", (task_id,)))

    def chord_part(self, group_id: str, task_id: str, size: int) -> bool:
        expires = self.settings.result_expires
        c, p = self._t["chords"], self._t["chord_parts"]

        def op(cur: Any) -> bool:
            now = time.time()
            expires_at = now + expires if expires else None
            cur.execute("BEGIN")
            try:
                # The chord's row locked exclusively first: callers on one chord go one
                # at a time, and each one's count sees every part committed before it.
                cur.execute(f"INSERT INTO {c} (group_id, fired_by, expires) VALUES "
                            "(%s, NULL, %s) ON DUPLICATE KEY UPDATE group_id = group_id",
                            (group_id, expires_at))
                cur.execute(f"SELECT expires, fired_by FROM {c} WHERE group_id = %s "
                            "FOR UPDATE", (group_id,))
                old_expires, fired_by = cur.fetchone()
                if old_expires is not None and old_expires <= now:
                    # Expired but not yet cleaned up: this count starts over.
                    cur.execute(f"DELETE FROM {p} WHERE group_id = %s", (group_id,))
                    fired_by = None
                cur.execute(f"UPDATE {c} SET expires = %s, fired_by = %s WHERE group_id = %s",
                            (expires_at, fired_by, group_id))
                cur.execute(f"INSERT IGNORE INTO {p} (group_id, task_id) VALUES (%s, %s)",
                            (group_id, task_id))
                fired = fired_by == task_id
                if fired_by is None:
                    cur.execute(f"SELECT count(*) FROM {p} WHERE group_id = %s", (group_id,))
                    if int(cur.fetchone()[0]) >= size:
                        cur.execute(f"UPDATE {c} SET fired_by = %s WHERE group_id = %s",
                                    (task_id, group_id))
                        fired = True
                cur.execute("COMMIT")
                return bool(fired)
            except BaseException:
                cur.connection.rollback()
                raise

        return self._run(op)

    def cleanup(self) -> int:
        now = time.time()
        self._run(lambda cur: cur.execute(  # parts go by the cascade; uncounted
            f"DELETE FROM {self._t['chords']} WHERE expires <= %s", (now,)))
        deleted = int(self._run(lambda cur: cur.execute(
            f"DELETE FROM {self._t['results']} WHERE expires <= %s", (now,))))
        if deleted:
            log.debug("deleted %d expired results from %s_results", deleted, self.namespace)
        return deleted

    def close(self) -> None:
        pid = os.getpid()
        with self._guard:
            mine = [s for s in self._states if s.pid == pid]
            # A parent's connections stay open: closing them would end its sessions.
            self._states = [s for s in self._states if s.pid != pid]
        for state in mine:
            state.close()
        self._local = threading.local()
