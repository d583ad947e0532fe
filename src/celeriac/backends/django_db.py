"""Results in django-celery-results' tables (``result_backend="django-db"``), through the
Django project's own database settings: its admin pages list them, and rows it already
holds read back.

The tables, as its migrations make them (``python manage.py migrate
django_celery_results``; this backend creates nothing)::

    django_celery_results_taskresult(id, task_id UNIQUE, status, content_type,
        content_encoding, result, date_created, date_started, date_done, traceback, meta,
        task_name, task_args, task_kwargs, worker, periodic_task_name)
    django_celery_results_groupresult(id, group_id UNIQUE, date_created, date_done,
        content_type, content_encoding, result)
    django_celery_results_chordcounter(id, group_id UNIQUE, sub_tasks, count)

Written as django-celery-results writes them: ``result`` is the result serializer's
encoding of the value (a failure's ``{"exc_type", "exc_message", "exc_module"}``),
base64 when binary (``content_encoding="binary"``); ``meta`` holds ``children`` and, here,
``retries`` (the table has no column for it). With ``result_extended``: ``task_name``,
``task_args``, ``task_kwargs`` (JSON) and ``worker``. Datetimes are Django's: aware UTC
with ``USE_TZ``, naive local time without.

Why SQL through Django's connections and not django-celery-results' models: its models
import ``celery`` (``celery.states``, ``celery.result``), which would make Celery a
dependency of every celeriac deployment on Django. The SQL is one portable dialect
(``INSERT ... ON CONFLICT``: SQLite >= 3.24 and PostgreSQL).

``django-db`` uses the ``default`` database; ``django-db://<alias>`` another of
``DATABASES``. Expiry: the table keeps no expiry, so a result older than
``result_expires`` (by ``date_done``) is not returned, and ``cleanup`` deletes it, as
django-celery-results' ``delete_expired``. Waiting polls every ``POLL`` seconds (no
change feed to listen to). Chords: the counter row of a chord celeriac counts holds, in
``sub_tasks``, celeriac's own JSON (``{"parts": [ids in order], "created": unix}``) and,
in ``count``, the parts still to come (django-celery-results' meaning); the last part
named is the one that completed it.
"""

from __future__ import annotations

import base64
import functools
import logging
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import orjson

from .. import serialization, states
from ..clients import django as dj
from ..clients.django import Connections, atomic, database_alias, read_moment
from ..errors import DecodeError
from .base import GROUP_KEY_PREFIX, ResultBackend, Stored, tuple_id

if TYPE_CHECKING:
    from ..settings import Settings

logger = logging.getLogger("celeriac.backends.django")

POLL = 0.1
"""Longest wait between two reads while waiting for results."""
TASKS = "django_celery_results_taskresult"
GROUPS = "django_celery_results_groupresult"
CHORDS = "django_celery_results_chordcounter"


class DjangoBackend(ResultBackend):
    scheme = "django-db"
    expiry_by_age = True  # the table has no expiry column
    compresses = False  # django-celery-results' readers do not decompress

    def __init__(self, url: str, settings: Settings) -> None:
        super().__init__(url, settings)
        self.alias = database_alias(url)
        self.db = Connections(self.alias, "result backend django-db")

    def _adapt(self, conn: Any, moment: datetime | None) -> Any:
        return None if moment is None else conn.ops.adapt_datetimefield_value(moment)

    def _cutoff(self, conn: Any) -> Any:
        """The oldest ``date_done`` still fresh, or None when results never expire."""
        expires = self.settings.result_expires
        return self._adapt(conn, dj.now() - timedelta(seconds=float(expires))) \
            if expires else None

    # -- encoding -------------------------------------------------------------------------
    def _encode(self, value: Any) -> tuple[str, str, str]:
        """``(content_type, content_encoding, text)`` as django-celery-results writes."""
        content_type, data = serialization.dumps(value, self.settings.result_serializer)
        if content_type == "application/json":
            return content_type, "utf-8", data.decode()
        return content_type, "binary", base64.b64encode(data).decode()

    def _decode_column(self, task_id: str, content_type: str, encoding: str,
                       text: str | None) -> Any:
        if text is None or text == "":
            return None
        data = base64.b64decode(text) if encoding == "binary" else text.encode()
        try:
            return serialization.loads(data, content_type, self.accept)
        except (ValueError, TypeError) as exc:
            raise DecodeError(f"the result of {task_id} in {TASKS} cannot be read as "
                              f"{content_type}: {exc}") from exc

    def _row(self, conn: Any, item: Stored) -> list[Any]:
        meta = serialization.loads(self.plain(item.data), item.content_type, self.accept)
        content_type, encoding, result = self._encode(meta.get("result"))
        extra: dict[str, Any] = {"children": meta.get("children") or []}
        if meta.get("retries"):
            extra["retries"] = meta["retries"]
        if meta.get("queue"):
            extra["queue"] = meta["queue"]
        _, _, meta_text = self._encode(extra)
        now = dj.now()
        args, kwargs = meta.get("args"), meta.get("kwargs")
        return [
            item.task_id, meta["status"], content_type, encoding, result,
            meta.get("traceback"), meta_text, self._adapt(conn, now), self._adapt(conn, now),
            self._adapt(conn, now) if meta["status"] == states.STARTED else None,
            meta.get("name"), None if args is None else self._encode(args)[2],
            None if kwargs is None else self._encode(kwargs)[2], meta.get("worker")]

    # -- writing ------------------------------------------------------------------------
    def store_many(self, items: Sequence[Stored]) -> None:
        groups = [item for item in items if item.task_id.startswith(GROUP_KEY_PREFIX)]
        tasks = [item for item in items if not item.task_id.startswith(GROUP_KEY_PREFIX)]

        def work(conn: Any) -> None:
            rows = [self._row(conn, item) for item in tasks]
            group_rows = [self._group_row(conn, item) for item in groups]
            if len(rows) == 1 and not group_rows:
                with conn.cursor() as cur:  # one statement: its own transaction
                    cur.execute(_UPSERT_TASK, rows[0])
                return
            with atomic(conn) as cur:
                if rows:
                    cur.executemany(_UPSERT_TASK, rows)
                if group_rows:
                    cur.executemany(_UPSERT_GROUP, group_rows)

        if items:
            self.db.run(work)

    def _group_row(self, conn: Any, item: Stored) -> list[Any]:
        """``GroupResult.save`` as django-celery-results' ``_save_group``: the group's
        ``as_tuple()``."""
        group_id = item.task_id[len(GROUP_KEY_PREFIX):]
        meta = serialization.loads(self.plain(item.data), item.content_type, self.accept)
        ids = (meta.get("result") or {}).get("results") or []
        content_type, encoding, text = self._encode(
            [[group_id, None], [[[i, None], None] for i in ids]])
        now = self._adapt(conn, dj.now())
        return [group_id, now, now, content_type, encoding, text]

    # -- reading ------------------------------------------------------------------------
    def _get(self, task_ids: Sequence[str]) -> dict[str, tuple[str, bytes]]:
        groups = [t for t in task_ids if t.startswith(GROUP_KEY_PREFIX)]
        tasks = [t for t in task_ids if not t.startswith(GROUP_KEY_PREFIX)]
        out: dict[str, tuple[str, bytes]] = {}
        if groups:
            out.update(self.db.run(lambda conn: self._groups(conn, groups)))
        for start in range(0, len(tasks), 500):
            batch = tasks[start:start + 500]
            out.update(self.db.run(functools.partial(self._tasks, ids=batch)))
        return out

    def _select(self, conn: Any, sql: str, ids: Sequence[str]) -> list[tuple[Any, ...]]:
        """Rows of ``sql`` (``{ids}``: the placeholders; ``{fresh}``: not expired)."""
        cutoff = self._cutoff(conn)
        fresh = "date_done >= %s" if cutoff is not None else "1 = 1"
        query = sql.format(ids=", ".join(["%s"] * len(ids)), fresh=fresh)
        with conn.cursor() as cur:
            cur.execute(query, [*ids, *([cutoff] if cutoff is not None else [])])
            rows: list[tuple[Any, ...]] = cur.fetchall()
        return rows

    def _tasks(self, conn: Any, *, ids: Sequence[str]) -> dict[str, tuple[str, bytes]]:
        out: dict[str, tuple[str, bytes]] = {}
        for row in self._select(conn, _SELECT_TASKS, ids):
            (task_id, status, content_type, encoding, result, tb, meta_text, done,
             name, args, kwargs, worker) = row
            extra = self._decode_column(task_id, content_type, encoding, meta_text) or {}
            moment = read_moment(done)
            meta: dict[str, Any] = {
                "task_id": task_id, "status": status,
                "result": self._decode_column(task_id, content_type, encoding, result),
                "traceback": tb, "retries": extra.get("retries", 0),
                "date_done": moment.isoformat() if moment and status in states.READY_STATES
                else None, "children": extra.get("children") or []}
            if name is not None:
                meta.update(name=name, worker=worker, queue=extra.get("queue"),
                            args=self._lenient(content_type, encoding, args),
                            kwargs=self._lenient(content_type, encoding, kwargs))
            out[task_id] = ("application/json", orjson.dumps(meta))
        return out

    def _lenient(self, content_type: str, encoding: str, text: str | None) -> Any:
        """Arguments as stored: Celery's workers store their repr (a string), ours JSON."""
        try:
            return self._decode_column("-", content_type, encoding, text)
        except DecodeError:
            return text

    def _groups(self, conn: Any, keys: Sequence[str]) -> dict[str, tuple[str, bytes]]:
        """Saved groups in celeriac's shape (``GroupResult.restore``)."""
        by_id = {key[len(GROUP_KEY_PREFIX):]: key for key in keys}
        out: dict[str, tuple[str, bytes]] = {}
        for group_id, content_type, encoding, text in self._select(
                conn, _SELECT_GROUPS, list(by_id)):
            try:
                value = self._decode_column(group_id, content_type, encoding, text)
                ids = [tuple_id(node) for node in value[1]]
            except (DecodeError, IndexError, TypeError) as exc:
                logger.warning("group %s: its %s row is unreadable: %s", group_id, GROUPS,
                               exc)
                continue
            out[by_id[group_id]] = ("application/json", orjson.dumps({
                "status": states.SUCCESS, "task_id": group_id,
                "result": {"group_id": group_id, "results": ids}}))
        return out

    def _wait(self, timeout: float) -> None:
        time.sleep(max(min(timeout, POLL), 0.0))  # sleep-ok: no change feed to wait on

    def forget(self, task_id: str) -> None:
        if task_id.startswith(GROUP_KEY_PREFIX):
            sql, key = f"DELETE FROM {GROUPS} WHERE group_id = %s", \
                task_id[len(GROUP_KEY_PREFIX):]
        else:
            sql, key = f"DELETE FROM {TASKS} WHERE task_id = %s", task_id

        def work(conn: Any) -> None:
            with conn.cursor() as cur:
                cur.execute(sql, [key])

        self.db.run(work)

    def cleanup(self) -> int:
        if not self.settings.result_expires:
            return 0

        def work(conn: Any) -> int:
            cutoff, removed = self._cutoff(conn), 0
            with atomic(conn) as cur:
                for table in (TASKS, GROUPS):  # as django-celery-results' cleanup
                    cur.execute(f"DELETE FROM {table} WHERE date_done < %s", [cutoff])
                    removed += max(cur.rowcount, 0)
                cur.execute(f"SELECT group_id, sub_tasks FROM {CHORDS}")
                stale = [gid for gid, text in cur.fetchall() if self._chord_expired(text)]
                for start in range(0, len(stale), 500):
                    part = stale[start:start + 500]
                    cur.execute(f"DELETE FROM {CHORDS} WHERE group_id IN "
                                f"({', '.join(['%s'] * len(part))})", part)  # uncounted
            return removed

        return self.db.run(work)

    # -- chords ---------------------------------------------------------------------------
    def _chord_expired(self, text: str | None) -> bool:
        """A counter of ours older than ``result_expires`` (one of Celery's: never)."""
        expires = self.settings.result_expires
        try:
            state = orjson.loads(text or "null")
        except orjson.JSONDecodeError:
            return False
        if not expires or not isinstance(state, dict):
            return False
        return float(state.get("created", 0)) < time.time() - float(expires)

    def chord_part(self, group_id: str, task_id: str, size: int) -> bool:
        return self.db.run(lambda conn: self._count(conn, group_id, task_id, size))

    def _count(self, conn: Any, group_id: str, task_id: str, size: int) -> bool:
        fresh = orjson.dumps({"parts": [], "created": time.time()}).decode()
        lock = " FOR UPDATE" if self.db.vendor == "postgresql" else ""
        with atomic(conn) as cur:
            # A write first: on SQLite it takes the database's write lock at once, so two
            # counters never both read the count before either writes it.
            cur.execute(f"INSERT INTO {CHORDS} (group_id, sub_tasks, count) VALUES "
                        "(%s, %s, %s) ON CONFLICT (group_id) DO NOTHING",
                        [group_id, fresh, size])
            cur.execute(f"SELECT sub_tasks FROM {CHORDS} WHERE group_id = %s{lock}",
                        [group_id])
            row = cur.fetchone()
            try:
                state = orjson.loads(row[0]) if row else None
            except orjson.JSONDecodeError:
                state = None
            if not isinstance(state, dict) or self._chord_expired(row[0] if row else None):
                state = orjson.loads(fresh)  # expired (or not ours): the count starts over
            parts: list[str] = list(state.get("parts") or [])
            if len(parts) >= size:
                return parts[size - 1] == task_id
            if task_id in parts:
                return False
            parts.append(task_id)
            state["parts"] = parts
            cur.execute(f"UPDATE {CHORDS} SET sub_tasks = %s, count = %s WHERE group_id = %s",
                        [orjson.dumps(state).decode(), max(size - len(parts), 0), group_id])
            return len(parts) >= size

    def close(self) -> None:
        self.db.close()


_UPSERT_TASK = f"""
INSERT INTO {TASKS} (task_id, status, content_type, content_encoding, result, traceback,
    meta, date_created, date_done, date_started, task_name, task_args, task_kwargs, worker)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (task_id) DO UPDATE SET status = excluded.status,
    content_type = excluded.content_type, content_encoding = excluded.content_encoding,
    result = excluded.result, traceback = excluded.traceback, meta = excluded.meta,
    date_done = excluded.date_done,
    date_started = COALESCE(excluded.date_started, {TASKS}.date_started),
    task_name = COALESCE(excluded.task_name, {TASKS}.task_name),
    task_args = COALESCE(excluded.task_args, {TASKS}.task_args),
    task_kwargs = COALESCE(excluded.task_kwargs, {TASKS}.task_kwargs),
    worker = COALESCE(excluded.worker, {TASKS}.worker)
"""
_UPSERT_GROUP = f"""
INSERT INTO {GROUPS} (group_id, date_created, date_done, content_type, content_encoding,
    result) VALUES (%s, %s, %s, %s, %s, %s)
ON CONFLICT (group_id) DO UPDATE SET date_done = excluded.date_done,
    content_type = excluded.content_type, content_encoding = excluded.content_encoding,
    result = excluded.result
"""
_SELECT_TASKS = (f"SELECT task_id, status, content_type, content_encoding, result, "
                 f"traceback, meta, date_done, task_name, task_args, task_kwargs, worker "
                 f"FROM {TASKS} WHERE task_id IN ({{ids}}) AND {{fresh}}")
_SELECT_GROUPS = (f"SELECT group_id, content_type, content_encoding, result FROM {GROUPS} "
                  f"WHERE group_id IN ({{ids}}) AND {{fresh}}")
