"""Beat from django-celery-beat's tables: ``beat_scheduler =
"django_celery_beat.schedulers:DatabaseScheduler"`` (``DjangoBeat``).

The periodic tasks are the rows of ``django_celery_beat_periodictask`` with their
schedule (``intervalschedule``, ``crontabschedule``, ``solarschedule``,
``clockedschedule``), as the Django admin edits them. Everything else is celeriac's
beat (``service.py``): one leader by the beat lease, each due time claimed once by its
run key in the shared store, then sent. Only what the entries are comes from Django.

Reading: the leader reads ``django_celery_beat_periodictasks.last_update`` (the row
django-celery-beat's signals move on every admin save or delete) each tick, and the
tasks again only when it moved; a tick comes at least every ``beat_max_loop_interval``,
so an edit takes effect within that. Rows changed with ``QuerySet.update()`` send no
signal: call ``PeriodicTasks.update_changed()`` after one, as with Celery.

Writing: after a run is sent, its row's ``last_run_at`` and ``total_run_count`` (what the
admin shows), and ``enabled = false`` for a ``one_off`` task. A row's ``start_time``
holds it back until then; past its ``expires`` it is not sent.

A row first seen by the shared store starts from its ``last_run_at`` (else the time it
was last changed), as django-celery-beat does; a clocked task that never ran, from just
before its time. Entries of ``beat_schedule`` still run, from the store; a row of the
same name wins over one.

Beats coordinate through the shared store as always; with a RabbitMQ broker and
``django-db`` results (no store of either), ``create_beat`` uses the Django database's
server (``django_store_url``: PostgreSQL or SQLite).

Why SQL through Django's connections and not django-celery-beat's models: they import
``celery``, which would make Celery a dependency of celeriac. Django is imported when a
``DjangoBeat`` first reads, never before.
"""

from __future__ import annotations

import json
import logging
import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ..clients.django import check_alias, database_alias, off_loop, read_moment
from ..errors import ConfigurationError
from ..stores import find_url, open_store
from . import schedules
from .entries import BeatEntry
from .service import Beat, from_ms, to_ms

if TYPE_CHECKING:
    from ..app import Celeriac

logger = logging.getLogger("celeriac.beat.django")

SCHEDULERS = frozenset({
    "django_celery_beat.schedulers:DatabaseScheduler",
    "django_celery_beat.schedulers.DatabaseScheduler", "django"})
"""``beat_scheduler`` values that select ``DjangoBeat`` (Celery's spellings)."""
SOURCE = "django"
"""``BeatEntry.source`` of the entries read from django-celery-beat's tables."""
PERIODS = ("days", "hours", "minutes", "seconds", "microseconds")
_P = "django_celery_beat_"
_ROWS = f"""
SELECT t.id, t.name, t.task, t.args, t.kwargs, t.queue, t.exchange, t.routing_key,
    t.headers, t.priority, t.expires, t.expire_seconds, t.one_off, t.start_time,
    t.last_run_at, t.total_run_count, t.date_changed,
    i.every, i.period, c.minute, c.hour, c.day_of_week, c.day_of_month, c.month_of_year,
    c.timezone, s.event, s.latitude, s.longitude, k.clocked_time
FROM {_P}periodictask t
LEFT JOIN {_P}intervalschedule i ON t.interval_id = i.id
LEFT JOIN {_P}crontabschedule c ON t.crontab_id = c.id
LEFT JOIN {_P}solarschedule s ON t.solar_id = s.id
LEFT JOIN {_P}clockedschedule k ON t.clocked_id = k.id
WHERE t.enabled
"""
_COLUMNS = ("id", "name", "task", "args", "kwargs", "queue", "exchange", "routing_key",
            "headers", "priority", "expires", "expire_seconds", "one_off", "start_time",
            "last_run_at", "total_run_count", "date_changed", "every", "period", "minute",
            "hour", "day_of_week", "day_of_month", "month_of_year", "timezone", "event",
            "latitude", "longitude", "clocked_time")


_UNREAD = object()
"""``Tables.version`` before the first read (``last_update`` itself may be None)."""


class clocked(schedules.BaseSchedule):
    """Once, at ``clocked_time`` (django-celery-beat's ``ClockedSchedule``)."""

    _type = "clocked"
    AFTER = timedelta(days=36500)
    """The "next run" after the one: far enough to never come, near enough to add to."""

    def __init__(self, clocked_time: datetime) -> None:
        super().__init__()
        self.clocked_time = clocked_time.astimezone(UTC)

    def next_run(self, after: datetime) -> datetime:
        if after < self.clocked_time:
            return self.clocked_time
        return after + self.AFTER

    def _fields(self) -> dict[str, Any]:
        return {"clocked_time": self.clocked_time.isoformat()}

    def __repr__(self) -> str:
        return f"<clocked: {self.clocked_time.isoformat()}>"


class Row:
    """One enabled ``PeriodicTask`` row, and the entry it makes (None: unreadable)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.id: int = values["id"]
        self.name: str = values["name"]
        self.one_off = bool(values["one_off"])
        self.start_time = read_moment(values["start_time"])
        self.expires = read_moment(values["expires"])
        self.last_run_at = read_moment(values["last_run_at"])
        self.date_changed = read_moment(values["date_changed"])
        self.total_run_count = int(values["total_run_count"] or 0)
        self.entry = self._entry(values)

    def _entry(self, v: dict[str, Any]) -> BeatEntry | None:
        try:
            schedule = _schedule(v)
            args, kwargs = json.loads(v["args"] or "[]"), json.loads(v["kwargs"] or "{}")
            headers = json.loads(v["headers"] or "{}")
            if not isinstance(args, list) or not isinstance(kwargs, dict) or \
                    not isinstance(headers, dict):
                raise ValueError("args must be a JSON list, kwargs and headers JSON objects")
        except (ValueError, TypeError, ImportError, ConfigurationError) as exc:
            logger.error("periodic task %r (django_celery_beat) cannot be read, skipped: %s",
                         v["name"], exc)
            return None
        options: dict[str, Any] = {k: v[k] for k in ("queue", "exchange", "routing_key",
                                                     "priority") if v[k] not in (None, "")}
        options["headers"] = {**headers, "periodic_task_name": v["name"]}
        if v["expire_seconds"]:
            options["expires"] = float(v["expire_seconds"])
        return BeatEntry(name=v["name"], task=v["task"], schedule=schedule,
                         args=tuple(args), kwargs=kwargs, options=options, source=SOURCE)

    def active(self, now: datetime) -> bool:
        """Sent at all now: not before its ``start_time``, nor after its ``expires``."""
        if self.start_time is not None and now < self.start_time:
            return False
        return self.expires is None or now < self.expires

    def start(self, now: datetime) -> datetime:
        """Where a row the store has not seen starts counting from."""
        entry = self.entry
        if entry is not None and isinstance(entry.schedule, clocked) and \
                self.total_run_count == 0:
            return min(now, entry.schedule.clocked_time - timedelta(milliseconds=1))
        known = self.last_run_at or self.date_changed
        return min(known, now) if known is not None else now


def _schedule(v: dict[str, Any]) -> schedules.BaseSchedule:
    if v["every"] is not None:
        if v["period"] not in PERIODS:
            raise ValueError(f"interval period {v['period']!r} is not one of {PERIODS}")
        return schedules.schedule(timedelta(**{v["period"]: int(v["every"])}))
    if v["minute"] is not None:
        return schedules.crontab(v["minute"], v["hour"], v["day_of_week"],
                                 v["day_of_month"], v["month_of_year"],
                                 tz=v["timezone"] or "UTC")
    if v["event"] is not None:
        return schedules.solar(v["event"], float(Decimal(v["latitude"])),
                               float(Decimal(v["longitude"])))
    clocked_time = read_moment(v["clocked_time"])
    if clocked_time is not None:
        return clocked(clocked_time)
    raise ValueError("it has no schedule (interval, crontab, solar or clocked)")


class Tables:
    """django-celery-beat's tables, read and written on one connection of this beat's
    own (made from ``DATABASES``; ticks never overlap, but run on any thread)."""

    def __init__(self, alias: str = "default") -> None:
        check_alias(alias, "beat_scheduler=django_celery_beat.schedulers:DatabaseScheduler")
        from django.db import connections

        self.alias = alias
        self._connections = connections
        self._conn: Any = None
        self._lock = threading.Lock()
        self.version: Any = _UNREAD
        self.rows: dict[str, Row] = {}

    def _db(self) -> Any:
        if self._conn is None:
            self._conn = self._connections.create_connection(self.alias)
            self._conn.inc_thread_sharing()
        return self._conn

    def _query(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        from django.db import InterfaceError, OperationalError

        with self._lock:
            try:
                with self._db().cursor() as cur:
                    cur.execute(sql, params)
                    rows: list[tuple[Any, ...]] = cur.fetchall() if cur.description else []
                return rows
            except (InterfaceError, OperationalError):
                self.close()  # reconnect next time (a server restart)
                raise

    def refresh(self) -> bool:
        """Read the rows again if ``PeriodicTasks.last_update`` moved; True if it did."""
        found = self._query(f"SELECT last_update FROM {_P}periodictasks WHERE ident = 1", [])
        version = found[0][0] if found else None
        if self.version is not _UNREAD and version == self.version:
            return False
        rows = [Row(dict(zip(_COLUMNS, r, strict=True))) for r in self._query(_ROWS, [])]
        self.rows = {row.name: row for row in rows}
        self.version = version
        logger.info("beat: %d enabled periodic task(s) read from django_celery_beat",
                    len(rows))
        return True

    def ran(self, row: Row, when: datetime) -> None:
        """Record a sent run in the row (and retire a one-off task)."""
        from django.conf import settings
        from django.utils import timezone

        moment = when if settings.USE_TZ else \
            timezone.make_naive(when, timezone.get_default_timezone())
        conn = self._db()
        value = conn.ops.adapt_datetimefield_value(moment)
        self._query(f"UPDATE {_P}periodictask SET last_run_at = %s, total_run_count = "
                    f"total_run_count + 1{', enabled = %s' if row.one_off else ''} "
                    "WHERE id = %s", [value, *([False] if row.one_off else []), row.id])
        if row.one_off:
            self.version = _UNREAD  # read again: the row is no longer enabled

    def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            off_loop(conn.close)


class DjangoBeat(Beat):
    """A ``Beat`` whose entries are also django-celery-beat's enabled rows."""

    def __init__(self, app: Celeriac, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.tables = Tables()
        self._shadowed: set[str] = set()
        self._db_down = False

    def load(self) -> dict[str, BeatEntry]:
        entries = super().load()
        self._refresh()
        now = datetime.fromtimestamp(self.clock(), UTC)
        for name, row in self.tables.rows.items():
            if row.entry is None or not row.active(now):
                entries.pop(name, None)
                continue
            if name in entries and entries[name].source != SOURCE and \
                    name not in self._shadowed:
                self._shadowed.add(name)
                logger.warning("beat entry %r: the django_celery_beat row of that name "
                               "is used, not the configured entry", name)
            entries[name] = row.entry
        return entries

    def _refresh(self) -> None:
        """Read the tables if they changed; while the database cannot be reached, go on
        with the rows last read (and the store's entries), saying so once."""
        from django.db import DatabaseError

        try:
            self.tables.refresh()
        except DatabaseError as exc:
            if not self._db_down:
                logger.warning("beat: django_celery_beat's tables cannot be read (%s); "
                               "going on with the %d periodic task(s) read before",
                               exc, len(self.tables.rows))
            self._db_down = True
            return
        if self._db_down:
            logger.warning("beat: django_celery_beat's tables can be read again")
        self._db_down = False

    def _entry_tick(self, entry: BeatEntry, last_ms: int | None) -> float:
        row = self.tables.rows.get(entry.name) if entry.source == SOURCE else None
        if row is not None and last_ms is None:
            now = datetime.fromtimestamp(self.clock(), UTC)
            start = to_ms(row.start(now))
            if self.store.advance(self.id, entry.name, start):
                last_ms = start
        return super()._entry_tick(entry, last_ms)

    def _send(self, entry: BeatEntry, schedule: Any, due: datetime) -> bool:
        sent = super()._send(entry, schedule, due)
        row = self.tables.rows.get(entry.name) if entry.source == SOURCE else None
        if sent and row is not None:
            try:
                self.tables.ran(row, from_ms(to_ms(datetime.fromtimestamp(self.clock(),
                                                                          UTC))))
            except Exception as exc:
                # The run was sent; only the admin's record of it is behind.
                logger.warning("periodic task %r: last_run_at not recorded: %s",
                               entry.name, exc)
        return sent

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.tables.close()


def create_beat(app: Celeriac, **kwargs: Any) -> Beat:
    """The beat ``beat_scheduler`` asks for: ``DjangoBeat`` for django-celery-beat's
    tables, else celeriac's own."""
    if app.settings.beat_scheduler not in SCHEDULERS:
        return Beat(app, **kwargs)
    settings = app.settings
    if "store" not in kwargs and find_url(settings) is None and \
            (settings.result_backend or "").startswith("django-db"):
        # RabbitMQ with results in Django's database: that database's server is the
        # shared store beats coordinate through (PostgreSQL, or SQLite on one machine).
        alias = database_alias(settings.result_backend or "")
        kwargs["store"] = open_store(settings, django_store_url(alias), "beat")
    return DjangoBeat(app, **kwargs)


def django_store_url(alias: str) -> str:
    """A shared store's URL for Django's database ``alias`` (PostgreSQL or SQLite)."""
    from django.conf import settings

    db = settings.DATABASES[alias]
    engine, name = str(db.get("ENGINE", "")), str(db.get("NAME", ""))
    if engine.endswith("sqlite3"):
        return f"sqlite:///{name}"
    if "postgresql" in engine:
        user = quote(str(db.get("USER") or ""), safe="")
        password = quote(str(db.get("PASSWORD") or ""), safe="")
        auth = f"{user}{':' + password if password else ''}@" if user else ""
        port = f":{db['PORT']}" if db.get("PORT") else ""
        return f"postgresql://{auth}{db.get('HOST') or 'localhost'}{port}/{quote(name)}"
    raise ConfigurationError(
        f"beat_scheduler=django_celery_beat...: beat needs a shared store, and Django's "
        f"database {alias!r} ({engine}) cannot be one; use a Redis or SQLite broker, or a "
        f"redis:// or postgresql:// result_backend")
