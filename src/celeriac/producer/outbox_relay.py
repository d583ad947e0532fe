"""The outbox relay: moves committed outbox rows to the broker, then deletes them.

One step, in one transaction of the relay's own connection: lock up to ``batch`` rows
(``FOR UPDATE SKIP LOCKED``: other relays skip them and take the next ones, so any
number can run), publish them (``publish_many`` returns once the broker holds every
one), delete them, commit. A failure before the commit (the broker down, the database
gone) rolls back: the rows unlock and are published again by the next attempt, with
backoff, by this relay or another. Between two steps the relay sleeps on ``LISTEN
<outbox_table>`` (the writers' ``pg_notify`` arrives as their transaction commits), at
most ``idle`` seconds.

Duplicates. A row is published twice only when its first publish reached the broker but
the delete did not commit: the relay was killed (or lost its database connection)
between the two, or the broker stored the messages yet the publish raised (a connection
dropped before the reply). With ``outbox_claim`` (the default) each publish carries a
fresh claim in the ``celeriac_chord_claim`` header; the worker claims the task's id with
it in the result backend before it runs the task (``canvas.followups.claimed``), and a
second copy, with another claim, is acknowledged unrun. So such a duplicate reaches the
broker but runs once; a Celery worker (which ignores the header) would run it twice.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from ..clients.net import backoff, mask_password, retrying
from ..errors import BrokerError, ConfigurationError, DecodeError
from ..protocol import new_id
from ..transports.base import Outgoing
from . import outbox as _outbox
from .outbox_adapters import PsycopgAdapter

if TYPE_CHECKING:
    from ..app import Celeriac

logger = logging.getLogger("celeriac.outbox.relay")

CLAIM_HEADER = "celeriac_chord_claim"
"""``canvas.followups.CLAIM_HEADER`` (the canvas sits above the producer; a test keeps
the two equal)."""
LOG_EVERY = 30.0
"""While publishing fails, one warning this often (seconds), not one per attempt."""


def _claims_held(app: Celeriac) -> bool:
    """Whether the result backend can hold claims (``rpc://`` cannot): a worker that
    cannot claim gives the message back, and it would never run."""
    try:
        app.backend.ensure_chords_allowed()
    except NotImplementedError as exc:
        logger.warning("outbox relay: publishing without claims, the result backend cannot "
                       "hold them (%s): a row published twice would run twice", exc)
        return False
    return True


class Relay:
    """Drains ``url``'s outbox (``outbox_url``) into ``app``'s broker until ``stop()``."""

    def __init__(self, app: Celeriac, url: str | None = None, *, batch: int = 500,
                 idle: float = 5.0) -> None:
        url = url or app.settings.outbox_url
        if not url:
            raise ConfigurationError("outbox_url is not set: the relay needs the PostgreSQL "
                                     "database that holds the outbox")
        if not url.startswith(("postgresql://", "postgres://")):
            raise ConfigurationError(f"outbox_url must be a postgresql:// URL, got "
                                     f"{mask_password(url)!r}")
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch!r}")
        if not idle > 0:
            raise ValueError(f"idle must be > 0 seconds, got {idle!r}")
        self.app, self.url, self.batch, self.idle = app, url, batch, idle
        self.table = app.settings.outbox_table
        self.claim = app.settings.outbox_claim and _claims_held(app)
        q = _outbox.quoted(self.table)
        self._select = f"SELECT id, task_id, queue, envelope, body, eta, fanout FROM {q} " \
                       "WHERE id <> ALL(%s) ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED"
        self._delete = f"DELETE FROM {q} WHERE id = ANY(%s)"
        self._stop = threading.Event()
        self._conn: Any = None
        self._listen: Any = None
        self.published = 0
        """Messages this relay published (and deleted)."""
        self.failures = 0
        """Steps that failed in a row (0 while it works)."""
        self._outage: float | None = None
        self.undecodable: set[int] = set()
        """Rows this relay found it cannot decode: left in the table, skipped from now."""
        self._logged = 0.0

    def stop(self) -> None:
        """Ask ``run`` to return (within half a second, or after the publish in hand)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> None:
        """Drain until ``stop()``; never raises for an outage (it retries with backoff)."""
        logger.info("outbox relay: draining %s of %s", self.table, mask_password(self.url))
        try:
            while not self._stop.is_set():
                moved = self._attempt()
                if moved is None:
                    self._stop.wait(backoff(self.failures, cap=5.0))
                elif moved < self.batch:
                    self._wait()
        finally:
            self.close()

    def _attempt(self) -> int | None:
        """One step; None when it failed (logged)."""
        import psycopg  # deferred: the postgres extra

        try:
            moved = self.drain_once()
        except (psycopg.Error, BrokerError, ConnectionError, OSError, TimeoutError) as exc:
            self._failed(exc, isinstance(exc, psycopg.Error))
            return None
        if self._outage is not None:
            logger.warning("outbox relay: publishing works again after %.1fs (%d attempts)",
                           time.monotonic() - self._outage, self.failures)
            self._outage, self.failures = None, 0
        return moved

    def _failed(self, exc: BaseException, database: bool) -> None:
        self.failures += 1
        now = time.monotonic()
        where = "database" if database else "broker"
        if self._outage is None:
            self._outage = self._logged = now
            logger.warning("outbox relay: %s failed (%s: %s); retrying with backoff, "
                           "nothing is lost", where, type(exc).__name__, exc)
        elif now - self._logged >= LOG_EVERY:
            self._logged = now
            logger.warning("outbox relay: %s still failing after %.0fs, %d attempts (%s: %s)",
                           where, now - self._outage, self.failures, type(exc).__name__, exc)
        if database:
            self.close()  # its transaction is gone with it; connect again

    def drain_once(self) -> int:
        """Publish and delete up to ``batch`` rows; how many (those it cannot decode
        included: they are skipped from now on)."""
        conn = self._connection()
        with conn.transaction():
            rows = conn.execute(self._select, (list(self.undecodable), self.batch)).fetchall()
            if not rows:
                return 0
            items, ids = self._decode(rows)
            if items:
                # No retries inside: a failure rolls the rows back, and run() backs off.
                with retrying(False, 0):
                    self.app.transport.publish_many(items)
            conn.execute(self._delete, (ids,))
        self.published += len(items)
        logger.debug("outbox relay: published %d message(s), %s first",
                     len(items), items[0].message.headers.get("id") if items else None)
        return len(rows)

    def _decode(self, rows: list[tuple[Any, ...]]) -> tuple[list[Outgoing], list[int]]:
        """The rows as messages (with a fresh claim each), and the ids to delete: a row
        that cannot be decoded is logged and kept, never sent nor lost."""
        now = time.time()
        items: list[Outgoing] = []
        ids: list[int] = []
        for row_id, task_id, queue, envelope, body, eta, fanout in rows:
            try:
                item = _outbox.outgoing(queue, envelope, body, eta, now, fanout)
            except DecodeError as exc:
                logger.error("outbox relay: task %s (row %s of %s) cannot be decoded (%s); "
                             "left in the table", task_id, row_id, self.table, exc)
                self.undecodable.add(row_id)
                continue
            if self.claim:
                item = Outgoing(item.queue, item.message.with_headers(
                    **{CLAIM_HEADER: new_id()}), item.delay, fanout=item.fanout)
            items.append(item)
            ids.append(row_id)
        return items, ids

    def _connection(self) -> Any:
        import psycopg  # deferred: the postgres extra

        if self._conn is None or self._conn.closed:
            conn = psycopg.connect(self.url, connect_timeout=5)
            try:
                with conn.transaction():
                    _outbox.ensure_table(PsycopgAdapter(conn), self.table, cache=False)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _wait(self) -> None:
        """Sleep until a writer's NOTIFY, ``stop()`` or ``idle`` seconds."""
        import psycopg  # deferred: the postgres extra

        deadline = time.monotonic() + self.idle
        try:
            if self._listen is None or self._listen.closed:
                # LISTEN first, then one more drain: a commit made before it is found so.
                self._listener()
                return
            listen = self._listen
            while not self._stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                if any(True for _ in listen.notifies(timeout=min(left, 0.5), stop_after=1)):
                    # Swallow the others already here: one drain serves them all.
                    for _ in listen.notifies(timeout=0):
                        pass
                    return
        except psycopg.Error as exc:
            logger.warning("outbox relay: LISTEN connection failed (%s); reconnecting", exc)
            self._close_listener()
            self._stop.wait(backoff(1))

    def _listener(self) -> Any:
        import psycopg  # deferred: the postgres extra
        from psycopg import sql

        if self._listen is None or self._listen.closed:
            listen = psycopg.connect(self.url, autocommit=True, connect_timeout=5)
            listen.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.table)))
            self._listen = listen
        return self._listen

    def _close_listener(self) -> None:
        if self._listen is not None:
            self._listen.close()
            self._listen = None

    def close(self) -> None:
        """Close the relay's database connections (``run`` does at its end)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._close_listener()
