"""The embedded broker: one SQLite file (WAL) shared by every process on one machine.

Schema::

    messages      one row per message. owner IS NULL and eta IS NULL: ready;
                  eta set: delayed until eta (unix time); owner set: delivered to
                  that consumer and not yet acked. deliveries counts hand-outs; tag
                  orders a fair queue's messages (NULL on a plain queue:
                  ``sqlite_fair.py``).
    consumers     live consumers and when their lease runs out.
    dead_letters  messages refused by a worker, with the reason.
    broadcasts    fanout payloads (events, control), kept BROADCAST_TTL seconds; each
                  subscriber reads the rows past its cursor when the doorbell rings.

A fetch is one write transaction: promote the due delayed messages, then claim up to
``limit`` ready ones (by priority, tag, id: index ``messages_next``) by setting ``owner``.
Ownership is the lease: a consumer renews ``consumers.expires`` on every lease renewal,
and any consumer's renewal hands the messages of expired consumers back to their queues in
one statement.

Faults of the file are errors naming it (``_sqlite.Database.fault``): a read-only file
fails ``ping`` (the worker's start) and a producer's publish with ``OperationalError``. A
file deleted or replaced while a worker runs (SQLite would go on with the old one, unseen)
is noticed at the next lease renewal; the worker's next fetch (or settling, when busy)
stops it, non-zero.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..clients.sqlite import Database, Doorbell, Listener, path_from_url
from ..errors import BrokerLost, DecodeError, OperationalError
from ..protocol import DECODE_ERROR_HEADER, Delivery, Message
from .base import PRIVATE_PREFIX, DeadLetter, Outgoing, Subscription, Transport
from .sqlite_fair import FAIR_HEADER, FAIR_SCHEMA, assign_tags, upgrade

if TYPE_CHECKING:
    from ..backends.base import Stored
    from ..settings import Settings

logger = logging.getLogger("celeriac.transports.sqlite")

SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    queue TEXT NOT NULL,
    priority INTEGER NOT NULL DEFAULT 0,
    eta REAL,
    owner TEXT,
    deliveries INTEGER NOT NULL DEFAULT 0,
    envelope BLOB NOT NULL,
    body BLOB NOT NULL,
    tag INTEGER
);
CREATE INDEX IF NOT EXISTS messages_delayed ON messages (eta) WHERE eta IS NOT NULL;
CREATE INDEX IF NOT EXISTS messages_owned ON messages (owner) WHERE owner IS NOT NULL;
CREATE TABLE IF NOT EXISTS consumers (
    id TEXT PRIMARY KEY,
    expires REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS dead_letters (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    queue TEXT NOT NULL,
    reason TEXT NOT NULL,
    deliveries INTEGER NOT NULL,
    dead_at REAL NOT NULL,
    envelope BLOB NOT NULL,
    body BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS broadcasts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    channel TEXT NOT NULL,
    payload BLOB NOT NULL,
    sent REAL NOT NULL
);
""" + FAIR_SCHEMA

# Safety net only: every publish rings the doorbell, so an idle consumer wakes at once.
_IDLE_RECHECK = 1.0
BROADCAST_TTL = 60.0


class SQLiteTransport(Transport):
    scheme = "sqlite"

    def __init__(self, url: str, settings: Settings) -> None:
        super().__init__(url, settings)
        self.path = path_from_url(url)
        self.db = Database(self.path, SCHEMA, role="broker", upgrade=upgrade)
        self.bell = Doorbell(self.path, "messages")
        self.broadcast_bell = Doorbell(self.path, "broadcast")
        self._listener: Listener | None = None
        self._broadcasts = 0
        self._lost: str | None = None
        """Why this consumer must stop (its file was deleted or replaced), found by a
        lease renewal: from then on it writes nothing (``_halted``)."""

    # -- producer -----------------------------------------------------------------------
    def publish_many(self, items: Sequence[Outgoing]) -> None:
        for item in items:
            self.check_size(item.message)
        now = time.time()
        rows = [
            (
                item.queue,
                item.message.priority,
                now + item.delay if item.delay and item.delay > 0 else None,
                item.message.envelope(),
                item.message.body,
            )
            for item in items
        ]
        fair = self.settings.broker_fair_queues
        with self.db.transaction() as conn:
            if fair and any(item.queue in fair for item in items):
                # Tagged in this transaction: producers take the write lock in turn.
                tags = assign_tags(conn, [
                    (item.queue, item.message.headers.get(FAIR_HEADER) or "")
                    if item.queue in fair else None for item in items])
                conn.executemany(
                    "INSERT INTO messages (queue, priority, eta, envelope, body, tag)"
                    " VALUES (?,?,?,?,?,?)",
                    [(*row, tag) for row, tag in zip(rows, tags, strict=True)])
            else:
                conn.executemany(
                    "INSERT INTO messages (queue, priority, eta, envelope, body)"
                    " VALUES (?,?,?,?,?)", rows)
        self.bell.ring()

    # -- consumer -----------------------------------------------------------------------
    async def connect(self, consumer_id: str) -> None:
        await super().connect(consumer_id)
        self._listener = self.bell.listen()
        self._renew()

    async def fetch(self, queues: Sequence[str], limit: int, timeout: float) -> list[Delivery]:
        assert self._listener is not None, "connect() first"
        deadline = time.monotonic() + timeout
        while True:
            if self._halted():
                await asyncio.sleep(min(timeout, _IDLE_RECHECK))
                return []
            # Drain before claiming: a ring that lands after the claim wakes the next wait.
            self._listener.drain()
            deliveries, next_eta = self._claim(queues, limit)
            if deliveries:
                return deliveries
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            wait = min(remaining, _IDLE_RECHECK)
            if next_eta is not None:
                wait = min(wait, max(next_eta - time.time(), 0.0))
            await self._listener.wait_async(wait)

    def _claim(self, queues: Sequence[str], limit: int) -> tuple[list[Delivery], float | None]:
        conn = self.db.conn()
        marks = ",".join("?" * len(queues))
        now = time.time()
        # A read first: an idle consumer must not take the write lock on every wake-up.
        ready, next_eta = self.db.read(
            f"SELECT EXISTS(SELECT 1 FROM messages WHERE owner IS NULL AND eta IS NULL"
            f" AND queue IN ({marks})), (SELECT min(eta) FROM messages WHERE eta IS NOT NULL)",
            (*queues,),
        )[0]
        if not ready and (next_eta is None or next_eta > now):
            return [], next_eta
        with self.db.transaction(conn):
            conn.execute("UPDATE messages SET eta = NULL WHERE eta IS NOT NULL AND eta <= ?",
                         (now,))
            rows = conn.execute(
                f"UPDATE messages SET owner = ?, deliveries = deliveries + 1 WHERE id IN ("
                f" SELECT id FROM messages WHERE owner IS NULL AND eta IS NULL"
                f" AND queue IN ({marks}) ORDER BY priority DESC, tag, id LIMIT ?)"
                f" RETURNING id, queue, priority, tag, deliveries, envelope, body",
                (self.consumer_id, *queues, limit),
            ).fetchall()
        # RETURNING order is unspecified; NULL tags (plain queues) sort first, as in SQL.
        rows.sort(key=lambda r: (-r[2], r[3] or 0, r[0]))
        return [
            Delivery(_message(envelope, body), queue, rid, deliveries)
            for rid, queue, _prio, _tag, deliveries, envelope, body in rows
        ], None

    async def settle_and_fetch(self, acks: Sequence[Delivery], results: Sequence[Stored],
                       results_namespace: str | None, queues: Sequence[str], limit: int
                       ) -> list[Delivery]:
        # A busy worker fetches nothing until a task ends: it stops when it settles one.
        if self._halted():
            return []
        return await super().settle_and_fetch(acks, results, results_namespace, queues, limit)

    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        ids = [(d.tag, self.consumer_id) for d in deliveries]
        with self.db.transaction() as conn:
            conn.executemany("DELETE FROM messages WHERE id = ? AND owner = ?", ids)

    async def requeue(self, deliveries: Sequence[Delivery], *, redelivered: bool,
                      delay: float = 0.0) -> None:
        uncount = 0 if redelivered else 1
        eta = time.time() + delay if delay > 0 else None
        with self.db.transaction() as conn:
            conn.executemany(
                "UPDATE messages SET owner = NULL, eta = ?,"
                " deliveries = max(deliveries - ?, 0) WHERE id = ? AND owner = ?",
                [(eta, uncount, d.tag, self.consumer_id) for d in deliveries],
            )
        self.bell.ring()

    async def dead_letter(self, delivery: Delivery, reason: str) -> None:
        with self.db.transaction() as conn:
            conn.execute(
                "INSERT INTO dead_letters (queue, reason, deliveries, dead_at, envelope, body)"
                " SELECT queue, ?, deliveries, ?, envelope, body FROM messages"
                " WHERE id = ? AND owner = ?",
                (reason, time.time(), delivery.tag, self.consumer_id),
            )
            conn.execute("DELETE FROM messages WHERE id = ? AND owner = ?",
                         (delivery.tag, self.consumer_id))

    async def renew_lease(self) -> int:
        return self._renew()

    def _renew(self) -> int:
        if self._lost is not None:
            raise BrokerLost(self._lost)
        try:
            self.db.check_file()
        except OperationalError as exc:
            # Not an outage to wait out: whatever this worker wrote from now on (acks,
            # results, its lease) would land in a file no other process can open. The
            # worker's lease renewal stops the worker on this error.
            self._lost = str(exc)
            raise BrokerLost(self._lost) from None
        now = time.time()
        with self.db.transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO consumers (id, expires) VALUES (?, ?)",
                (self.consumer_id, now + self.settings.worker_lease_timeout),
            )
            conn.execute("DELETE FROM consumers WHERE expires < ?", (now,))
            restored = conn.execute(
                "UPDATE messages SET owner = NULL WHERE owner IS NOT NULL"
                " AND owner NOT IN (SELECT id FROM consumers)"
            ).rowcount
        if restored:
            logger.warning("returned %d message(s) of dead consumers to their queues", restored)
            self.bell.ring()
        return restored

    def _halted(self) -> bool:
        """True once the file is lost: fetches and settles do nothing while the worker
        stops (what it owns is in the lost file)."""
        return self._lost is not None

    async def disconnect(self) -> None:
        if self._lost is not None:
            # Nothing to give back: what it owns is in the deleted (or replaced) file.
            self.consumer_id = None
        if self.consumer_id is not None:
            with self.db.transaction() as conn:
                given_back = conn.execute(
                    "UPDATE messages SET owner = NULL, deliveries = max(deliveries - 1, 0)"
                    " WHERE owner = ?", (self.consumer_id,)
                ).rowcount
                conn.execute("DELETE FROM consumers WHERE id = ?", (self.consumer_id,))
            if given_back:
                self.bell.ring()
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    # -- administration -----------------------------------------------------------------
    def ping(self) -> None:
        """The file opens and takes a write: a worker on a read-only file would get as
        far as its first write (the lease, at connect) and fail there."""
        with self.db.transaction() as conn:
            # A write that changes nothing: refused on a read-only file, commits nothing.
            conn.execute("DELETE FROM consumers WHERE 0")

    def queue_length(self, queue: str) -> int:
        row = self.db.read(
            "SELECT count(*) FROM messages WHERE queue = ? AND owner IS NULL AND eta IS NULL",
            (queue,),
        )[0]
        return int(row[0])

    def purge(self, queue: str) -> int:
        with self.db.transaction() as conn:
            return conn.execute(
                "DELETE FROM messages WHERE queue = ? AND owner IS NULL", (queue,)
            ).rowcount

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        rows = self.db.read(
            "SELECT id, queue, reason, deliveries, dead_at, envelope, body FROM dead_letters"
            " ORDER BY id LIMIT ?", (limit,),
        )
        return [DeadLetter(r[0], r[1], r[2], _message(r[5], r[6]), r[3], r[4]) for r in rows]

    def requeue_dead(self, ids: Sequence[int | str]) -> int:
        marks = ",".join("?" * len(ids))
        with self.db.transaction() as conn:
            conn.execute(
                f"INSERT INTO messages (queue, priority, envelope, body)"
                f" SELECT queue, 0, envelope, body FROM dead_letters WHERE id IN ({marks})",
                (*ids,),
            )
            moved = conn.execute(f"DELETE FROM dead_letters WHERE id IN ({marks})",
                                 (*ids,)).rowcount
        if moved:
            self.bell.ring()
        return moved

    def purge_dead(self, ids: Sequence[int | str] | None = None) -> int:
        with self.db.transaction() as conn:
            if ids is None:
                return conn.execute("DELETE FROM dead_letters").rowcount
            marks = ",".join("?" * len(ids))
            return conn.execute(f"DELETE FROM dead_letters WHERE id IN ({marks})",
                                (*ids,)).rowcount

    # -- broadcast ----------------------------------------------------------------------
    def broadcast(self, channel: str, payload: bytes, routing_key: str = "") -> None:
        now = time.time()
        with self.db.transaction() as conn:
            conn.execute("INSERT INTO broadcasts (channel, payload, sent) VALUES (?, ?, ?)",
                         (channel, payload, now))
            self._broadcasts += 1
            if self._broadcasts % 100 == 1:
                conn.execute("DELETE FROM broadcasts WHERE sent < ?", (now - BROADCAST_TTL,))
        self.broadcast_bell.ring()

    async def subscribe(self, channel: str) -> Subscription:
        listener = self.broadcast_bell.listen()
        try:
            cursor = self.db.read("SELECT coalesce(max(id), 0) FROM broadcasts")[0][0]
        except BaseException:
            listener.close()  # no subscription owns it yet: the caller never sees it
            raise
        return _SQLiteSubscription(self, channel, listener, int(cursor))

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self.bell.close()
        self.broadcast_bell.close()
        self.db.close()


class _SQLiteSubscription(Subscription):
    def __init__(self, transport: SQLiteTransport, channel: str, listener: Listener,
                 cursor: int) -> None:
        self.transport = transport
        self.channel = channel
        self.listener = listener
        self.cursor = cursor
        self.buffer: deque[bytes] = deque()

    async def get(self, timeout: float) -> bytes | None:
        deadline = time.monotonic() + timeout
        while not self.buffer:
            self.listener.drain()
            rows = self.transport.db.read(
                "SELECT id, payload FROM broadcasts WHERE id > ? AND channel = ?"
                " ORDER BY id LIMIT 500", (self.cursor, self.channel))
            if rows:
                self.cursor = rows[-1][0]
                self.buffer.extend(r[1] for r in rows)
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            await self.listener.wait_async(min(remaining, _IDLE_RECHECK))
        return self.buffer.popleft()

    async def close(self) -> None:
        self.listener.close()
        if self.channel.startswith(PRIVATE_PREFIX):
            # A reply channel has no other reader: its rows go with it (a reply that
            # comes later still lives BROADCAST_TTL seconds).
            with self.transport.db.transaction() as conn:
                conn.execute("DELETE FROM broadcasts WHERE channel = ?", (self.channel,))


def _message(envelope: bytes, body: bytes) -> Message:
    try:
        return Message.from_envelope(envelope, body)
    except DecodeError as exc:
        # Keep the bytes: the consumer dead-letters it with this reason.
        return Message({DECODE_ERROR_HEADER: str(exc)}, body, "application/data")
