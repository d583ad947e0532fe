"""Reaching a Django project's database (``DATABASES``), for the ``django-db`` result
backend and beat on django-celery-beat's tables.

``Connections`` makes connections of its own from ``DATABASES`` (one per thread, as
Django's are), not Django's shared ones: a store never joins, nor is undone with, the
caller's ``atomic()`` block, and closing them is ours to do. A forked child never uses
its parent's (closing one would end the parent's session: they are kept referenced,
never closed); a thread that ended has its connection closed when another is made (a web
server's thread per request). Django refuses database calls on a thread that runs an
event loop (the worker's): ``off_loop`` moves such calls to a thread.

Django is imported when one of these is first used, never at import.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ..errors import BrokerUnavailable, ConfigurationError

logger = logging.getLogger("celeriac.clients.django")

T = TypeVar("T")
VENDORS = ("postgresql", "sqlite")
_INHERITED: list[Any] = []
"""Connections a forked child found open in its parent's name: kept referenced, never
closed nor collected (either would end the parent's session)."""


def read_moment(value: Any) -> datetime | None:
    """A datetime column as aware UTC (SQLite gives text; without ``USE_TZ`` Django keeps
    local time)."""
    if value is None:
        return None
    moment = datetime.fromisoformat(value) if isinstance(value, str) else value
    if not isinstance(moment, datetime):
        return None
    if moment.tzinfo is None:
        from django.conf import settings as django_settings
        from django.utils import timezone

        zone = UTC if django_settings.USE_TZ else timezone.get_default_timezone()
        moment = moment.replace(tzinfo=zone)
    return moment.astimezone(UTC)


def now() -> datetime:
    """Django's now: aware UTC with ``USE_TZ``, naive local time without."""
    from django.utils import timezone

    moment: datetime = timezone.now()
    return moment


def off_loop(fn: Callable[[], T]) -> T:
    """``fn()``, in another thread if this one runs an event loop (the worker's: its
    timer's results cleanup, its close at exit), where Django refuses database calls
    (``SynchronousOnlyOperation``). The loop waits as for any blocking store."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return fn()
    with ThreadPoolExecutor(1, thread_name_prefix="celeriac-django") as pool:
        return pool.submit(fn).result()


def database_alias(url: str) -> str:
    """``django-db`` -> ``default``; ``django-db://other`` -> ``other``."""
    host = urlsplit(url).netloc if "://" in url else ""
    return host or "default"


def check_alias(alias: str, what: str) -> None:
    """``ConfigurationError`` (naming ``what``) unless Django is installed, configured,
    and has database ``alias``."""
    try:
        from django.conf import settings as django_settings
        from django.core.exceptions import ImproperlyConfigured
    except ImportError as exc:
        raise ConfigurationError(f"{what} needs Django: pip install 'celeriac[django]'"
                                 ) from exc
    try:
        databases = django_settings.DATABASES  # loads DJANGO_SETTINGS_MODULE if unread
    except ImproperlyConfigured as exc:
        raise ConfigurationError(
            f"{what}: Django's settings are not configured (set DJANGO_SETTINGS_MODULE "
            f"before the app is used): {exc}") from None
    if alias not in databases:
        raise ConfigurationError(f"{what}: no database {alias!r} in DATABASES (known: "
                                 f"{', '.join(sorted(databases))})")


class Connections:
    """This process's own connections to database ``alias``, one per thread."""

    def __init__(self, alias: str, what: str) -> None:
        check_alias(alias, what)
        self.alias = alias
        self.what = what
        """What uses them, for errors and logs: "result backend django-db"."""
        self.vendor: str | None = None
        self._local = threading.local()
        self._opened: list[tuple[int, threading.Thread, Any]] = []
        """Every connection made, with its process and thread."""
        self._lock = threading.Lock()

    def get(self) -> Any:
        """This thread's connection (made on first use)."""
        held = getattr(self._local, "conn", None)
        if held is not None and held[0] == os.getpid():
            return held[1]
        from django.db import connections

        conn = connections.create_connection(self.alias)
        conn.inc_thread_sharing()  # close() closes every thread's, from one thread
        if conn.vendor not in VENDORS:
            raise ConfigurationError(f"{self.what}: database {self.alias!r} is "
                                     f"{conn.vendor}; it runs on {' and '.join(VENDORS)}")
        self.vendor = conn.vendor
        pid, me = os.getpid(), threading.current_thread()
        with self._lock:
            ended = [c for p, t, c in self._opened if p == pid and not t.is_alive()]
            self._opened = [(p, t, c) for p, t, c in self._opened
                            if p != pid or t.is_alive()]
            self._opened.append((pid, me, conn))
        for old in ended:
            old.close()
        self._local.conn = (pid, conn)
        return conn

    def count(self) -> int:
        """Connections held (this process's and inherited ones)."""
        with self._lock:
            return len(self._opened)

    def run(self, work: Callable[[Any], T]) -> T:
        """``work(connection)``, off the event loop; once more on a fresh connection if
        the first was broken (a server restart), then ``BrokerUnavailable``."""
        return off_loop(functools.partial(self._attempts, work))

    def _attempts(self, work: Callable[[Any], T]) -> T:
        from django.db import InterfaceError, OperationalError

        for attempt in (1, 2):
            conn = self.get()
            try:
                return work(conn)
            except (InterfaceError, OperationalError) as exc:
                if attempt == 2:
                    raise BrokerUnavailable(f"{self.what} ({self.alias}): {exc}") from exc
                logger.warning("%s (%s): %s; reconnecting", self.what, self.alias, exc)
                conn.close()
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close this process's connections (a forked child's inherited ones are kept)."""
        with self._lock:
            opened, self._opened = self._opened, []
        for pid, _, conn in opened:
            if pid == os.getpid():
                off_loop(conn.close)
            else:
                _INHERITED.append(conn)
        self._local = threading.local()


@contextmanager
def atomic(conn: Any) -> Iterator[Any]:
    """One transaction on ``conn`` (committed, or rolled back on any error): a cursor."""
    conn.set_autocommit(False)
    try:
        with conn.cursor() as cur:
            yield cur
        conn.commit()
    except BaseException:
        with suppress(Exception):  # a broken connection: closed by the caller
            conn.rollback()
        raise
    finally:
        with suppress(Exception):
            conn.set_autocommit(True)
