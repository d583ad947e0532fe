"""Results in the tables of Celery's SQLAlchemy backend on MySQL or MariaDB
(``db+mysql://user@host:3306/db``, and ``db+mysql+pymysql://``, the URLs a Celery user
has), on PyMySQL: the PostgreSQL layout's twin (``db_results.py``, which says what the
columns hold, how chords complete and how results expire), in MySQL's dialect.

Celery's schema as SQLAlchemy makes it, created here if missing (binary columns as
``LONGBLOB``, ``date_done`` to the microsecond; a table Celery made has ``BLOB`` and
whole seconds, which Celery and celeriac both read and write). Ids come from the
sequences ``task_id_sequence`` and ``taskset_id_sequence`` on MariaDB (SQLAlchemy makes
them there, and Celery then inserts ``NEXTVAL``: an AUTO_INCREMENT of ours would collide
with them), from AUTO_INCREMENT on MySQL; what a table's ``id`` takes is read from the
table itself::

    celery_taskmeta(id integer PRIMARY KEY, task_id varchar(155) UNIQUE,
                    status varchar(50), result longblob, date_done datetime(6),
                    traceback text, children longblob, name varchar(155), args longblob,
                    kwargs longblob, worker varchar(155), retries integer,
                    queue varchar(155), stamps longblob)
    celery_tasksetmeta(id integer PRIMARY KEY, taskset_id varchar(155) UNIQUE,
                       result longblob, date_done datetime(6))

MySQL has no notifications: a waiter reads again every ``_POLL`` seconds, as it does for
Celery's writes on PostgreSQL. Chord bodies' claims are kept in ``celeriac_chords`` and
``celeriac_chord_parts`` as there (one transaction that locks the chord's row).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pymysql
import pymysql.err

from ..backends.base import GROUP_KEY_PREFIX, ResultBackend, Stored
from ..backends.mysql import parse_url
from ..clients.net import mask_password
from ..errors import BrokerUnavailable, OperationalError
from .db_results import EXTENDED, group_meta, group_row, row_meta, task_row

if TYPE_CHECKING:
    from ..settings import Settings

logger = logging.getLogger("celeriac.backends.celery_db")

_POLL = 0.1
_BIN = "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
_ID = "id integer NOT NULL {} PRIMARY KEY"


def _schema(sequences: bool) -> list[str]:
    """Celery's tables as SQLAlchemy makes them: on MariaDB (``sequences``) ids from the
    sequences ``task_id_sequence`` and ``taskset_id_sequence``, on MySQL from
    AUTO_INCREMENT; then celeriac's chord claims."""
    ident = _ID.format("" if sequences else "AUTO_INCREMENT")
    return [
        *(["CREATE SEQUENCE IF NOT EXISTS task_id_sequence",
           "CREATE SEQUENCE IF NOT EXISTS taskset_id_sequence"] if sequences else []),
        f"CREATE TABLE IF NOT EXISTS celery_taskmeta ({ident}, task_id varchar(155) {_BIN}"
        " UNIQUE, status varchar(50), result longblob, date_done datetime(6), traceback text,"
        " children longblob, name varchar(155), args longblob, kwargs longblob,"
        " worker varchar(155), retries integer, queue varchar(155), stamps longblob,"
        " KEY ix_celery_taskmeta_date_done (date_done))",
        f"CREATE TABLE IF NOT EXISTS celery_tasksetmeta ({ident}, taskset_id varchar(155)"
        f" {_BIN} UNIQUE, result longblob, date_done datetime(6),"
        " KEY ix_celery_tasksetmeta_date_done (date_done))",
        "CREATE TABLE IF NOT EXISTS celeriac_chords (group_id varchar(255) NOT NULL"
        " PRIMARY KEY, fired_by varchar(255) NULL, created double NOT NULL)",
        "CREATE TABLE IF NOT EXISTS celeriac_chord_parts (group_id varchar(255) NOT NULL,"
        " task_id varchar(255) NOT NULL, PRIMARY KEY (group_id, task_id), FOREIGN KEY"
        " (group_id) REFERENCES celeriac_chords (group_id) ON DELETE CASCADE)",
    ]


_FRESH = ("(%s IS NULL OR date_done IS NULL OR "
          "date_done >= UTC_TIMESTAMP(6) - INTERVAL %s MICROSECOND)")
"""Not expired (``db_results._FRESH``), with ``_fresh()``'s parameters."""


class CeleryMySQLBackend(ResultBackend):
    scheme = "db+mysql"
    chords_by_unlock = True
    retries_with_request = True
    expiry_by_age = True
    compresses = False

    def __init__(self, url: str, settings: Settings) -> None:
        super().__init__(url, settings)
        self.safe_url = mask_password(url)
        _, self._kwargs = parse_url(url)
        self._kwargs.update(
            autocommit=True, charset="utf8mb4",
            connect_timeout=max(1, round(settings.broker_connection_timeout)),
            init_command="SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        self._local = threading.local()
        self._columns: set[str] | None = None
        self._ids: dict[str, str] = {}
        """Per table, what its ``id`` column takes: ``NEXTVAL(...), `` or nothing."""
        self._opened: list[tuple[int, Any]] = []
        self._lock = threading.Lock()

    # -- connections ----------------------------------------------------------------------
    def _conn(self) -> Any:
        held = getattr(self._local, "conn", None)
        if held is not None and held[0] == os.getpid():
            return held[1]
        try:
            conn = pymysql.connect(**self._kwargs)
        except pymysql.err.Error as exc:
            raise BrokerUnavailable(f"cannot reach the result backend {self.safe_url}: "
                                    f"{exc}") from exc
        with self._lock:
            self._opened.append((os.getpid(), conn))
        self._local.conn = (os.getpid(), conn)
        if self._columns is None:
            try:
                self._prepare(conn)
            except pymysql.err.Error as exc:
                self._drop()
                raise OperationalError(f"result backend {self.safe_url}: cannot make "
                                       f"Celery's tables: {exc}") from exc
        return conn

    def _prepare(self, conn: Any) -> None:
        """Make the tables if missing, then learn their columns and where their ids come
        from: a table SQLAlchemy made on MariaDB takes them from a sequence (its
        ``id`` has no default), one made on MySQL from AUTO_INCREMENT."""
        with conn.cursor() as cur:
            cur.execute("SELECT VERSION()")
            for statement in _schema("mariadb" in str(cur.fetchone()[0]).lower()):
                cur.execute(statement)
            cur.execute("SELECT table_name, column_name, extra FROM information_schema.columns "
                        "WHERE table_schema = DATABASE() AND table_name IN "
                        "('celery_taskmeta', 'celery_tasksetmeta')")
            rows = [(str(t).lower(), str(c).lower(), str(e).lower())
                    for t, c, e in cur.fetchall()]
        self._ids = {table: "" if "auto_increment" in extra else
                     f"NEXTVAL({'task' if table == 'celery_taskmeta' else 'taskset'}"
                     "_id_sequence), " for table, column, extra in rows if column == "id"}
        self._columns = {column for table, column, _ in rows if table == "celery_taskmeta"}

    def _run(self, sql: str, params: Sequence[Any] = (), many: bool = False
             ) -> list[tuple[Any, ...]]:
        """One statement (``many``: for each of ``params``); a lost connection is opened
        again once (every write here is an upsert or a delete: it may be repeated)."""
        for attempt in (1, 2):
            conn = self._conn()
            try:
                with conn.cursor() as cur:
                    if many:
                        cur.executemany(sql, params)
                    else:
                        cur.execute(sql, params)
                    return list(cur.fetchall())
            except pymysql.err.OperationalError as exc:
                self._drop()
                if attempt == 2:
                    raise BrokerUnavailable(f"result backend {self.safe_url}: {exc}") from exc
            except pymysql.err.Error as exc:
                raise OperationalError(f"result backend {self.safe_url}: {exc}") from exc
        raise AssertionError("unreachable")

    def _count(self, sql: str, params: Sequence[Any]) -> int:
        """How many rows one statement changed (no retry: a delete is run again by the
        next cleanup)."""
        try:
            with self._conn().cursor() as cur:
                return int(cur.execute(sql, params))
        except pymysql.err.Error as exc:
            self._drop()
            raise OperationalError(f"result backend {self.safe_url}: {exc}") from exc

    def _drop(self) -> None:
        held = getattr(self._local, "conn", None)
        self._local.conn = None
        if held is not None and held[0] == os.getpid():
            with contextlib.suppress(pymysql.err.Error):
                held[1].close()

    def _extended(self) -> list[str]:
        if self._columns is None:
            self._conn()
        assert self._columns is not None
        return [c for c in EXTENDED if c in self._columns]

    # -- writing ----------------------------------------------------------------------
    def store_many(self, items: Sequence[Stored]) -> None:
        groups = [item for item in items if item.task_id.startswith(GROUP_KEY_PREFIX)]
        if groups:
            self._extended()  # the tables made and their ids known
            nextval = self._ids.get("celery_tasksetmeta", "")
            self._run(f"INSERT INTO celery_tasksetmeta ({'id, ' if nextval else ''}taskset_id,"
                      f" result, date_done) VALUES ({nextval}%s, %s, UTC_TIMESTAMP(6)) ON "
                      "DUPLICATE KEY UPDATE result = VALUES(result), date_done = "
                      "VALUES(date_done)", [group_row(item) for item in groups], many=True)
            items = [item for item in items if not item.task_id.startswith(GROUP_KEY_PREFIX)]
        if not items:
            return
        extended = self._extended()
        assert self._columns is not None
        children = "children" in self._columns
        names = ["status", "result", "date_done", "traceback", *extended]
        if children:
            names.append("children")
        # date_done is the server's time of the write, as Celery's column default makes
        # it: expiry is judged by the server's clock, from when the row was written.
        marks = ["IF(%s IS NULL, NULL, UTC_TIMESTAMP(6))" if n == "date_done" else "%s"
                 for n in names]
        nextval = self._ids.get("celery_taskmeta", "")
        sql = (f"INSERT INTO celery_taskmeta ({'id, ' if nextval else ''}task_id, "
               f"{', '.join(names)}) VALUES ({nextval}%s, {', '.join(marks)}) ON DUPLICATE KEY "
               "UPDATE "
               + ", ".join(f"{n} = VALUES({n})" for n in names))
        self._run(sql, [task_row(item, extended, children) for item in items], many=True)

    # -- reading ----------------------------------------------------------------------
    def _fresh(self) -> tuple[float | None, int]:
        expires = self.settings.result_expires
        return (float(expires) if expires else None), int((expires or 0) * 1_000_000)

    def _get(self, task_ids: Sequence[str]) -> dict[str, tuple[str, bytes]]:
        keys = [t for t in task_ids if t.startswith(GROUP_KEY_PREFIX)]
        ids = [t for t in task_ids if not t.startswith(GROUP_KEY_PREFIX)]
        out: dict[str, tuple[str, bytes]] = {}
        if keys:
            by_id = {key[len(GROUP_KEY_PREFIX):]: key for key in keys}
            rows = self._run(
                f"SELECT taskset_id, result FROM celery_tasksetmeta WHERE taskset_id IN "
                f"({', '.join(['%s'] * len(by_id))}) AND {_FRESH}", (*by_id, *self._fresh()))
            out.update({by_id[gid]: ("application/json", meta) for gid, stored in rows
                        if gid in by_id and (meta := group_meta(gid, stored)) is not None})
        if ids:
            extended = self._extended()
            assert self._columns is not None
            children = "children" if "children" in self._columns else "NULL"
            rows = self._run(
                f"SELECT task_id, status, result, traceback, date_done, {children}"
                f"{''.join(', ' + c for c in extended)} FROM celery_taskmeta "
                f"WHERE task_id IN ({', '.join(['%s'] * len(ids))}) AND {_FRESH}",
                (*ids, *self._fresh()))
            wanted = set(ids)  # a case-insensitive table may return another case's row
            out.update({row[0]: ("application/json", row_meta(row, extended))
                        for row in rows if row[0] in wanted})
        return out

    def _wait(self, timeout: float) -> None:
        time.sleep(max(min(timeout, _POLL), 0.0))  # no notifications in MySQL

    def forget(self, task_id: str) -> None:
        if task_id.startswith(GROUP_KEY_PREFIX):
            self._run("DELETE FROM celery_tasksetmeta WHERE taskset_id = %s",
                      (task_id[len(GROUP_KEY_PREFIX):],))
        else:
            self._run("DELETE FROM celery_taskmeta WHERE task_id = %s", (task_id,))

    def cleanup(self) -> int:
        expires = self.settings.result_expires
        if not expires:
            return 0
        removed = 0
        micros = int(expires * 1_000_000)
        for table in ("celery_taskmeta", "celery_tasksetmeta"):  # as Celery's cleanup
            removed += self._count(f"DELETE FROM {table} WHERE date_done < "
                                   "UTC_TIMESTAMP(6) - INTERVAL %s MICROSECOND", (micros,))
        self._run("DELETE FROM celeriac_chords WHERE created < %s", (time.time() - expires,))
        return removed

    # -- claims of chord bodies (celeriac's own tables) --------------------------------
    def chord_part(self, group_id: str, task_id: str, size: int) -> bool:
        try:
            return self._chord_part(group_id, task_id, size)
        except pymysql.err.Error as exc:
            # Rolled back: the header task's message goes back and counts again.
            self._drop()
            raise OperationalError(f"result backend {self.safe_url}: counting a part of "
                                   f"chord {group_id}: {exc}") from exc

    def _chord_part(self, group_id: str, task_id: str, size: int) -> bool:
        conn = self._conn()
        expires = self.settings.result_expires
        with conn.cursor() as cur:
            cur.execute("BEGIN")
            try:
                if expires:  # a chord older than result_expires is gone, as its results
                    cur.execute("DELETE FROM celeriac_chords WHERE group_id = %s AND "
                                "created < %s", (group_id, time.time() - expires))
                # Locks the row exclusively, new or not: callers go one at a time.
                cur.execute("INSERT INTO celeriac_chords (group_id, created) VALUES (%s, %s)"
                            " ON DUPLICATE KEY UPDATE group_id = group_id",
                            (group_id, time.time()))
                cur.execute("SELECT fired_by FROM celeriac_chords WHERE group_id = %s "
                            "FOR UPDATE", (group_id,))
                fired_by = cur.fetchone()[0]
                fired = fired_by == task_id
                if fired_by is None:
                    cur.execute("INSERT IGNORE INTO celeriac_chord_parts VALUES (%s, %s)",
                                (group_id, task_id))
                    cur.execute("SELECT count(*) FROM celeriac_chord_parts WHERE "
                                "group_id = %s", (group_id,))
                    if int(cur.fetchone()[0]) >= size:
                        cur.execute("UPDATE celeriac_chords SET fired_by = %s WHERE "
                                    "group_id = %s", (task_id, group_id))
                        fired = True
                cur.execute("COMMIT")
            except BaseException:
                conn.rollback()
                raise
        return bool(fired)

    def close(self) -> None:
        with self._lock:
            opened, self._opened = self._opened, []
        for pid, conn in opened:
            if pid == os.getpid():
                with contextlib.suppress(pymysql.err.Error):
                    conn.close()
        self._local = threading.local()
