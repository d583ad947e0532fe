"""Results in the tables of Celery's SQLAlchemy backend, on PostgreSQL
(``db+postgresql://user@host:5432/db``, the URL Celery users already have): a Celery
client's ``AsyncResult.get()`` reads a celeriac worker's result and the reverse.

Celery 5.7's schema (``celery/backends/database/models.py``), created here if missing::

    celery_taskmeta(id integer PRIMARY KEY (from the sequence task_id_sequence),
                    task_id varchar(155) UNIQUE, status varchar(50), result bytea,
                    date_done timestamp (UTC, no zone), traceback text, children bytea,
                    -- with result_extended (Celery's TaskExtended):
                    name varchar(155), args bytea, kwargs bytea, worker varchar(155),
                    retries integer, queue varchar(155), stamps bytea)

``result``, ``children``, ``args`` and ``kwargs`` are JSON bytes (the result serializer's
encoding of the value Celery's ``encode_result`` makes: a failure's ``{"exc_type",
"exc_message", "exc_module"}``). Rows written by Celery before 5.7 hold a pickle
(SQLAlchemy's ``PickleType``); those are read with an unpickler that refuses every class
and function, so reading one runs nothing, and a pickled object that is not plain data
raises ``DecodeError``. Only columns the table has are written (a table Celery made
without ``result_extended`` has no extended columns).

``GroupResult.save`` writes Celery's ``celery_tasksetmeta`` row (``result`` the JSON of
the group's ``as_tuple()``), so either side restores the other's groups.

Chords complete as Celery completes them on this backend: by ``celery.chord_unlock``, a
task that polls the header's results and sends the body (``chords_by_unlock``; the
producer sends it, a Celery or a celeriac worker runs it). Header tasks only store their
results. Not Celery's, beside its tables: ``celeriac_chords`` and ``celeriac_chord_parts``,
where a chord body's claim is kept (``followups.claimed``: a body sent twice runs once
on celeriac workers).

Expiry: Celery's table keeps none per result, so a result older than ``result_expires``
is not returned (``_FRESH``); its row stays until ``cleanup`` (or Celery's
``celery.backend_cleanup``). Waiting: our writes NOTIFY ``celeriac_celery_taskmeta`` and a
waiting thread LISTENs on a connection of its own; Celery's writers send nothing, so no
wait lasts longer than 0.1 s before it reads again.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson
import psycopg

from ..backends.base import GROUP_KEY_PREFIX, ResultBackend, Stored, tuple_id
from ..errors import BrokerUnavailable, DecodeError

if TYPE_CHECKING:
    from ..settings import Settings

logger = logging.getLogger("celeriac.backends.celery_db")

EXTENDED = ("name", "args", "kwargs", "worker", "retries", "queue")
_POLL = 0.1
"""Longest wait between two looks: Celery's writers send no notification."""
CHANNEL = "celeriac_celery_taskmeta"
"""NOTIFYed (empty payload) by each of our writes, so our waiters wake at once."""
_SCHEMA = """
CREATE SEQUENCE IF NOT EXISTS task_id_sequence;
CREATE TABLE IF NOT EXISTS celery_taskmeta (
    id integer NOT NULL PRIMARY KEY, task_id varchar(155) UNIQUE, status varchar(50),
    result bytea, date_done timestamp without time zone, traceback text, children bytea,
    name varchar(155), args bytea, kwargs bytea, worker varchar(155), retries integer,
    queue varchar(155), stamps bytea);
CREATE SEQUENCE IF NOT EXISTS taskset_id_sequence;
CREATE TABLE IF NOT EXISTS celery_tasksetmeta (
    id integer NOT NULL PRIMARY KEY, taskset_id varchar(155) UNIQUE, result bytea,
    date_done timestamp without time zone);
CREATE TABLE IF NOT EXISTS celeriac_chords (group_id text PRIMARY KEY, fired_by text);
ALTER TABLE celeriac_chords ADD COLUMN IF NOT EXISTS
    created timestamptz NOT NULL DEFAULT now();
CREATE TABLE IF NOT EXISTS celeriac_chord_parts (
    group_id text REFERENCES celeriac_chords ON DELETE CASCADE, task_id text,
    PRIMARY KEY (group_id, task_id));
"""


class _PlainUnpickler(pickle.Unpickler):
    """Containers, strings and numbers only: any global (a class, a function) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


def loads_plain(data: bytes) -> Any:
    return _PlainUnpickler(io.BytesIO(data)).load()


_FRESH = ("(%s::float8 IS NULL OR date_done IS NULL OR date_done >= "
          "(now() at time zone 'utc') - make_interval(secs => %s::float8))")
"""Not expired: a result older than ``result_expires`` is gone on read, as on every
backend, though its row stays until ``cleanup`` (Celery's ``celery.backend_cleanup``)."""


def _value(stored: Any) -> Any:
    """A stored result: JSON (Celery 5.7), or an older Celery's pickle of plain data."""
    if stored is None:
        return None
    data = bytes(stored)
    if data[:1] == b"\x80":  # a pickle's PROTO opcode; JSON never starts with it
        return loads_plain(data)
    return orjson.loads(data)


def row_meta(row: Sequence[Any], extended: Sequence[str]) -> bytes:
    """A ``celery_taskmeta`` row (``task_id, status, result, traceback, date_done,
    children``, then the ``extended`` columns) as the JSON of celeriac's result meta."""
    task_id, status, result, tb, done, sent = row[:6]
    try:
        value, sent = _value(result), _value(sent)
    except (pickle.UnpicklingError, EOFError, ValueError, orjson.JSONDecodeError) as exc:
        raise DecodeError(f"the result of {task_id} in celery_taskmeta is neither "
                          f"JSON nor a pickle of plain data ({exc}); use "
                          "result_serializer='json' on the Celery side") from exc
    meta: dict[str, Any] = {
        "status": status, "result": value, "traceback": tb,
        "date_done": done.replace(tzinfo=UTC).isoformat() if done else None,
        "task_id": task_id, "children": sent or []}
    for name, field in zip(extended, row[6:], strict=True):
        meta[name] = orjson.loads(field) if name in ("args", "kwargs") and \
            field is not None else field
    if meta.get("name") is None:
        for name in extended:
            meta.pop(name, None)
    return orjson.dumps(meta)


def group_meta(group_id: str, stored: Any) -> bytes | None:
    """A ``celery_tasksetmeta`` row's result as a saved group's meta (``GroupResult.
    restore``), or None (logged) when it cannot be read."""
    try:
        ids = [tuple_id(node) for node in _value(stored)[1]]
    except (pickle.UnpicklingError, EOFError, ValueError, orjson.JSONDecodeError,
            IndexError, TypeError) as exc:
        logger.warning("group %s: its celery_tasksetmeta row is unreadable: %s",
                       group_id, exc)
        return None
    return orjson.dumps({"status": "SUCCESS", "task_id": group_id,
                         "result": {"group_id": group_id, "results": ids}})


def group_row(item: Stored) -> tuple[str, bytes]:
    """celeriac's ``GroupResult.save`` as Celery's ``_save_group``: the group's id and
    its ``as_tuple()`` for ``celery_tasksetmeta``."""
    group_id = item.task_id[len(GROUP_KEY_PREFIX):]
    ids = (orjson.loads(item.data).get("result") or {}).get("results") or []
    return group_id, orjson.dumps([[group_id, None], [[[i, None], None] for i in ids]])


def task_row(item: Stored, extended: Sequence[str], children: bool) -> list[Any]:
    """The ``celery_taskmeta`` values of a stored result: ``task_id, status, result,
    date_done, traceback``, the ``extended`` columns, then ``children`` if the table
    has it."""
    meta = orjson.loads(item.data)
    done = meta.get("date_done")
    row: list[Any] = [
        item.task_id, meta["status"], orjson.dumps(meta.get("result")),
        datetime.fromisoformat(done).astimezone(UTC).replace(tzinfo=None) if done
        else None, meta.get("traceback")]
    for name in extended:
        value = meta.get(name)
        row.append(orjson.dumps(value) if name in ("args", "kwargs") and
                   value is not None else value)
    if children:
        row.append(orjson.dumps(meta["children"]) if meta.get("children") else None)
    return row


class CeleryDatabaseBackend(ResultBackend):
    scheme = "db+postgresql"
    chords_by_unlock = True
    retries_with_request = True  # the retries column is one of the extended ones
    expiry_by_age = True  # Celery's table has no expiry column
    compresses = False  # Celery's database backend neither writes nor reads compressed

    def __init__(self, url: str, settings: Settings) -> None:
        super().__init__(url, settings)
        # Celery's URL names SQLAlchemy's dialect; libpq wants the plain one.
        rest = url.split("://", 1)[1] if "://" in url else url
        self.dsn = "postgresql://" + rest
        self._local = threading.local()
        self._columns: set[str] | None = None
        self._opened: list[tuple[int, psycopg.Connection[tuple[Any, ...]]]] = []
        """Every connection opened, any thread's, with its process: ``close`` closes this
        process's (a forked child must not end its parent's sessions)."""
        self._lock = threading.Lock()

    # -- connections ----------------------------------------------------------------------
    def _open(self) -> psycopg.Connection[tuple[Any, ...]]:
        try:
            conn = psycopg.connect(self.dsn, autocommit=True,
                                   connect_timeout=max(1, round(
                                       self.settings.broker_connection_timeout)))
        except psycopg.OperationalError as exc:
            raise BrokerUnavailable(f"cannot reach the result backend at "
                                    f"{self.dsn.split('@')[-1]}: {exc}") from exc
        with self._lock:
            self._opened = [(pid, c) for pid, c in self._opened if not c.closed]
            self._opened.append((os.getpid(), conn))
        return conn

    def _held(self, slot: str) -> psycopg.Connection[tuple[Any, ...]] | None:
        """This thread's open connection in ``slot`` (not one inherited across a fork)."""
        held = getattr(self._local, slot, None)
        if held is not None and held[0] == os.getpid() and not held[1].closed:
            conn: psycopg.Connection[tuple[Any, ...]] = held[1]
            return conn
        return None

    def _conn(self) -> psycopg.Connection[tuple[Any, ...]]:
        conn = self._held("conn")
        if conn is not None:
            return conn
        conn = self._open()
        self._local.conn = (os.getpid(), conn)
        if self._columns is None:
            with conn.transaction():
                # One creator at a time (two workers starting together).
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('celery_taskmeta'))")
                conn.execute(_SCHEMA)
            self._columns = {row[0] for row in conn.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_name = 'celery_taskmeta'")}
        return conn

    # -- writing ------------------------------------------------------------------------
    def store_many(self, items: Sequence[Stored]) -> None:
        groups = [item for item in items if item.task_id.startswith(GROUP_KEY_PREFIX)]
        if groups:
            self._save_groups(groups)
            items = [item for item in items if not item.task_id.startswith(GROUP_KEY_PREFIX)]
        if not items:
            return
        conn = self._conn()
        assert self._columns is not None
        extended = [c for c in EXTENDED if c in self._columns]
        names = ["status", "result", "date_done", "traceback", *extended]
        if "children" in self._columns:
            names.append("children")
        sql = (f"INSERT INTO celery_taskmeta (id, task_id, {', '.join(names)}) VALUES "
               f"(nextval('task_id_sequence'), %s, {', '.join(['%s'] * len(names))}) "
               f"ON CONFLICT (task_id) DO UPDATE SET "
               + ", ".join(f"{n} = EXCLUDED.{n}" for n in names))
        rows = [task_row(item, extended, "children" in self._columns) for item in items]
        with conn.transaction(), conn.cursor() as cur:
            cur.executemany(sql, rows)
            cur.execute(f"NOTIFY {CHANNEL}")  # delivered at commit

    def _save_groups(self, groups: Sequence[Stored]) -> None:
        """celeriac's ``GroupResult.save`` as Celery's ``_save_group``: the group's
        ``as_tuple()`` in ``celery_tasksetmeta``."""
        rows = [group_row(item) for item in groups]
        conn = self._conn()
        with conn.transaction(), conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO celery_tasksetmeta (id, taskset_id, result, date_done) VALUES "
                "(nextval('taskset_id_sequence'), %s, %s, now() at time zone 'utc') "
                "ON CONFLICT (taskset_id) DO UPDATE SET result = EXCLUDED.result, "
                "date_done = EXCLUDED.date_done", rows)

    # -- reading ------------------------------------------------------------------------
    def _get(self, task_ids: Sequence[str]) -> dict[str, tuple[str, bytes]]:
        groups = [t for t in task_ids if t.startswith(GROUP_KEY_PREFIX)]
        if groups:
            found = self._groups(groups)
            rest = [t for t in task_ids if not t.startswith(GROUP_KEY_PREFIX)]
            return {**found, **self._get(rest)} if rest else found
        if not task_ids:
            return {}
        conn = self._conn()
        assert self._columns is not None
        extended = [c for c in EXTENDED if c in self._columns]
        children = "children" if "children" in self._columns else "NULL"
        rows = conn.execute(
            f"SELECT task_id, status, result, traceback, date_done, {children}"
            f"{''.join(', ' + c for c in extended)} FROM celery_taskmeta "
            f"WHERE task_id = ANY(%s) AND {_FRESH}", (list(task_ids), *self._fresh())
        ).fetchall()
        return {row[0]: ("application/json", row_meta(row, extended)) for row in rows}

    def _groups(self, keys: Sequence[str]) -> dict[str, tuple[str, bytes]]:
        """Saved groups in celeriac's shape (``GroupResult.restore``), from Celery's rows."""
        by_id = {key[len(GROUP_KEY_PREFIX):]: key for key in keys}
        rows = self._conn().execute(
            f"SELECT taskset_id, result FROM celery_tasksetmeta WHERE taskset_id = ANY(%s) "
            f"AND {_FRESH}", (list(by_id), *self._fresh())).fetchall()
        return {by_id[group_id]: ("application/json", meta) for group_id, stored in rows
                if (meta := group_meta(group_id, stored)) is not None}

    def _expires(self) -> float | None:
        return float(self.settings.result_expires) if self.settings.result_expires else None

    def _fresh(self) -> tuple[float | None, float | None]:
        """``_FRESH``'s parameters."""
        return self._expires(), self._expires()

    def _listener(self) -> psycopg.Connection[tuple[Any, ...]]:
        conn = self._held("listener")
        if conn is not None:
            return conn
        conn = self._open()
        conn.execute(f"LISTEN {CHANNEL}")
        self._local.listener = (os.getpid(), conn)
        return conn

    def _cursor(self) -> None:
        # Listening before wait_for's first read: a write during that read still wakes
        # the wait that follows it. What came before is read anyway: dropped.
        for _ in self._listener().notifies(timeout=0):
            pass
        return None

    def _wait(self, timeout: float) -> None:
        # Ours NOTIFY; Celery's writers do not, so no wait is longer than _POLL.
        wait = max(min(timeout, _POLL), 0.0)
        try:
            listener = self._listener()
            for _ in listener.notifies(timeout=wait, stop_after=1):
                pass
            for _ in listener.notifies(timeout=0):  # the rest already here: one wake
                pass
        except psycopg.OperationalError as exc:
            logger.warning("waiting for results: %s; polling instead", exc)
            time.sleep(wait)

    def forget(self, task_id: str) -> None:
        if task_id.startswith(GROUP_KEY_PREFIX):
            self._conn().execute("DELETE FROM celery_tasksetmeta WHERE taskset_id = %s",
                                 (task_id[len(GROUP_KEY_PREFIX):],))
            return
        self._conn().execute("DELETE FROM celery_taskmeta WHERE task_id = %s", (task_id,))

    def cleanup(self) -> int:
        expires = self.settings.result_expires
        if not expires:
            return 0
        conn, removed = self._conn(), 0
        for table in ("celery_taskmeta", "celery_tasksetmeta"):  # as Celery's cleanup
            removed += conn.execute(
                f"DELETE FROM {table} WHERE date_done < "
                "(now() at time zone 'utc') - make_interval(secs => %s)",
                (float(expires),)).rowcount
        conn.execute("DELETE FROM celeriac_chords WHERE created < now() - "
                     "make_interval(secs => %s)", (float(expires),))  # uncounted
        return removed

    # -- claims of chord bodies (celeriac's own tables) ----------------------------------
    def chord_part(self, group_id: str, task_id: str, size: int) -> bool:
        conn = self._conn()
        with conn.transaction():
            if self._expires() is not None:
                # A chord older than result_expires is gone, as its results are.
                conn.execute("DELETE FROM celeriac_chords WHERE group_id = %s AND created < "
                             "now() - make_interval(secs => %s)", (group_id, self._expires()))
            conn.execute("INSERT INTO celeriac_chords (group_id) VALUES (%s) "
                         "ON CONFLICT DO NOTHING", (group_id,))
            row = conn.execute("SELECT fired_by FROM celeriac_chords WHERE group_id = %s "
                               "FOR UPDATE", (group_id,)).fetchone()
            fired_by = row[0] if row else None
            if fired_by is not None:
                return bool(fired_by == task_id)
            conn.execute("INSERT INTO celeriac_chord_parts VALUES (%s, %s) "
                         "ON CONFLICT DO NOTHING", (group_id, task_id))
            count = conn.execute("SELECT count(*) FROM celeriac_chord_parts WHERE "
                                 "group_id = %s", (group_id,)).fetchone()
            if count is not None and int(count[0]) >= size:
                conn.execute("UPDATE celeriac_chords SET fired_by = %s WHERE group_id = %s",
                             (task_id, group_id))
                return True
        return False

    def close(self) -> None:
        with self._lock:
            opened, self._opened = self._opened, []
        for pid, conn in opened:
            if pid == os.getpid() and not conn.closed:
                conn.close()
        self._local = threading.local()
