"""Producers and administration for the AMQP transport, on pika.

pika's ``BlockingConnection`` is not thread-safe, so each thread of each process has its
own connection (a ``_Link``), made on first use. A process forked with a link inherits
the parent's socket: the child never uses it, never closes it (a Connection.Close on a
shared socket would end the parent's connection) and connects anew.

Dead letters are read through aiormq (``link.dead_letters``): pika's decoder turns
float header values into ints, which a dead letter requeued through it would keep.

Every operation runs through ``SyncClient.call``: on a connection or channel failure it
drops the link and tries again per ``broker_connection_retry`` /
``broker_connection_max_retries`` (exponential backoff with jitter, failover across the
``;``-separated URLs), then raises ``OperationalError`` naming the URL, password masked.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import pika
import pika.exceptions

from ...clients.net import backoff, retry_policy
from ...errors import BrokerUnavailable, OperationalError
from ..base import Outgoing
from . import wire

if TYPE_CHECKING:
    from ...settings import Settings

logger = logging.getLogger("celeriac.transports.amqp")

T = TypeVar("T")
CONFIRM_TIMEOUT = 30.0
"""Seconds a batch may wait for publisher confirms before it is sent again."""
_ABANDONED: list[_Link] = []
"""Links inherited across fork(): kept referenced so that nothing ever closes them here."""
_CANNOT_ENCODE = (pika.exceptions.ProtocolSyntaxError, pika.exceptions.ShortStringTooLong)


_QUIET = threading.local()  # ``on`` while this thread probes for a queue that may be gone


class _QuietFilter(logging.Filter):
    """Drops pika's warnings about channels the broker closed (404) during a probe."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(_QUIET, "on", False)


logging.getLogger("pika.channel").addFilter(_QuietFilter())
if logging.getLogger("pika").level == logging.NOTSET:
    # pika logs every connection and channel at INFO: a worker at -l info drowned in it.
    logging.getLogger("pika").setLevel(logging.WARNING)


class _Retry(Exception):
    """Not confirmed (nack, return, timeout, channel closed): send again."""


class _Unreachable(Exception):
    def __init__(self, failures: list[tuple[str, BaseException]]) -> None:
        super().__init__("; ".join(f"{wire.masked(u)}: {wire.describe(e)}" for u, e in failures))
        self.urls = [u for u, _ in failures]


_RETRYABLE = (pika.exceptions.AMQPError, OSError, _Retry, _Unreachable)
_Send = tuple[str, str, bytes, bytes, bool]
"""exchange, routing key, body, encoded properties, mandatory"""


class _Encoded(pika.BasicProperties):  # type: ignore[misc]
    """Properties encoded by ``wire`` (pika cannot put a float in a headers table)."""

    def __init__(self, raw: bytes) -> None:
        super().__init__()
        self.raw = raw

    def encode(self) -> list[bytes]:
        return [self.raw]


def _noop() -> None:
    """Scheduled to end ``process_data_events`` as soon as a confirm arrived."""


class _Link:
    """One connection, its confirm-mode channel and an admin channel; one thread's."""

    def __init__(self, conn: pika.BlockingConnection, url: str) -> None:
        self.conn = conn
        self.url = url
        self.pid = os.getpid()
        self.thread = threading.current_thread()
        self.ch: Any = None
        self._admin: Any = None
        self.next_tag = 0
        self.outstanding: set[int] = set()
        self.nacked: set[int] = set()
        self.returned: list[tuple[str, str, bytes]] = []
        self.queues: set[str] = set()
        self.delays: dict[str, tuple[int, float]] = {}
        self.exchanges: set[str] = set()

    def channel(self) -> Any:
        """The publishing channel, in confirm mode."""
        if self.ch is None or not self.ch.is_open:
            ch = self.conn.channel()
            selected: list[bool] = []
            # pika's BlockingChannel waits for each confirm before the next publish; a
            # batch needs many in flight, so confirm mode is driven on the channel
            # underneath and the connection pumped until the whole batch is confirmed.
            ch._impl.confirm_delivery(ack_nack_callback=self._on_confirm,
                                      callback=lambda _frame: self._done(selected))
            ch._impl.add_on_return_callback(self._on_return)
            self.ch, self.next_tag = ch, 0
            self.outstanding.clear()
            self.nacked.clear()
            self.pump(lambda: bool(selected), CONFIRM_TIMEOUT)
        return self.ch

    def admin(self) -> Any:
        """A plain channel for declarations and queries that may close it (404, 406)."""
        if self._admin is None or not self._admin.is_open:
            self._admin = self.conn.channel()
        return self._admin

    def _done(self, flag: list[bool]) -> None:
        flag.append(True)
        self.conn.add_callback_threadsafe(_noop)  # ends the pump's wait at once

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        tags = ({t for t in self.outstanding if t <= method.delivery_tag} if method.multiple
                else {method.delivery_tag})
        self.outstanding -= tags
        if isinstance(method, pika.spec.Basic.Nack):
            self.nacked |= tags
        if not self.outstanding:
            self.conn.add_callback_threadsafe(_noop)

    def _on_return(self, _ch: Any, method: Any, _props: Any, body: bytes) -> None:
        self.returned.append((method.exchange, method.routing_key, body))

    def pump(self, until: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            if self.ch is not None and self.ch.is_closed:
                raise _Retry("the broker closed the publishing channel")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Retry(f"no confirm from the broker within {timeout:.0f}s")
            self.conn.process_data_events(time_limit=min(remaining, 0.25))

    def close(self) -> None:
        try:
            if self.conn.is_open:
                self.conn.close()
        except Exception as exc:  # closing a broken connection: nothing left to do
            logger.debug("closing %s: %s", wire.masked(self.url), exc)


class SyncClient:
    def __init__(self, config: wire.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        self._local = threading.local()
        # Strong references: a link is closed by close(), or by the next connect once its
        # thread has ended (a thread-local alone would leave its socket to the GC).
        self._links: set[_Link] = set()
        self._lock = threading.Lock()
        self._good = 0  # index of the URL that last worked (round-robin starts there)
        self.auto_delete: set[str] = set()
        """Queues this worker declared auto-delete (its fanout queues): declared alike
        here (a copy parked until its eta), or RabbitMQ refuses the declaration."""

    # -- connections ----------------------------------------------------------------------
    def _link(self) -> _Link:
        link: _Link | None = getattr(self._local, "link", None)
        if link is not None and link.pid != os.getpid():
            _ABANDONED.append(link)
            link = None
        if link is None or not link.conn.is_open:
            link = self._connect()
            self._local.link = link
            with self._lock:
                ended = {x for x in self._links if not x.thread.is_alive()}
                self._links = (self._links - ended) | {link}
            for old in ended:
                if old.pid == os.getpid():
                    old.close()
        return link

    def _connect(self) -> _Link:
        failures: list[tuple[str, BaseException]] = []
        for url in self.config.ordered(self._good):
            params = pika.URLParameters(url)
            params.virtual_host = wire.vhost(url)
            params.socket_timeout = params.stack_timeout = self.settings.broker_connection_timeout
            params.blocked_connection_timeout = CONFIRM_TIMEOUT
            params.client_properties = {"connection_name": f"celeriac producer {os.getpid()}"}
            try:
                conn = pika.BlockingConnection(params)
            except (pika.exceptions.AMQPError, OSError) as exc:
                failures.append((url, exc))
                continue
            self._good = self.config.urls.index(url)
            return _Link(conn, url)
        raise _Unreachable(failures)

    def _drop(self) -> None:
        link: _Link | None = getattr(self._local, "link", None)
        self._local.link = None
        if link is not None and link.pid == os.getpid():
            link.close()

    def call(self, what: str, op: Callable[[_Link], T], *, retry: bool = True) -> T:
        attempt = 0
        while True:
            try:
                return op(self._link())
            except _CANNOT_ENCODE as exc:
                raise OperationalError(f"{what}: the message cannot be sent over AMQP: "
                                       f"{wire.describe(exc)}") from exc
            except _RETRYABLE as exc:
                where = ", ".join(wire.masked(u) for u in (
                    exc.urls if isinstance(exc, _Unreachable) else [self.config.urls[self._good]]))
                self._drop()
                attempt += 1
                allowed, limit = retry_policy(self.settings)
                if not retry or not allowed or (limit is not None and attempt > limit):
                    cls = BrokerUnavailable if isinstance(exc, _Unreachable) else OperationalError
                    raise cls(f"{what} failed on {where} after {attempt} attempt(s): "
                              f"{wire.describe(exc)}") from exc
                delay = backoff(attempt)
                logger.warning("%s failed on %s (%s); retry %d in %.1fs", what, where,
                               wire.describe(exc), attempt, delay)
                time.sleep(delay)

    def close(self) -> None:
        with self._lock:
            links, self._links = list(self._links), set()
        for link in links:
            if link.pid == os.getpid():
                link.close()
        self._local = threading.local()

    # -- declarations ---------------------------------------------------------------------
    def _declare(self, link: _Link, name: str, arguments: dict[str, Any]) -> None:
        if name in link.queues:
            return
        try:
            _QUIET.on = True
            link.admin().queue_declare(name, durable=True, arguments=arguments,
                                       auto_delete=name in self.auto_delete)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != 406:
                raise
            # Declared otherwise (by Celery, an older setting): use it rather than fail.
            logger.warning("queue %r exists with other arguments (%s); using it as it is",
                           name, exc.reply_text)
            link.admin().queue_declare(name, passive=True)
        finally:
            _QUIET.on = False
        link.queues.add(name)

    def _declare_delays(self, link: _Link, queue: str, top: int) -> None:
        """Delay levels 0..top of ``queue``: level k holds a message 2**k ms, then hands
        it to the exchange of level k-1, which routes it by bit k-1 of its routing key."""
        have, when = link.delays.get(queue, (-1, 0.0))
        if time.monotonic() - when > wire.REDECLARE_DELAYS_AFTER:
            have = -1  # re-declare all: x-expires counts from the last declaration
        if have >= top:
            return
        ch, c = link.admin(), self.config
        for k in range(have + 1, top + 1):
            name = c.delay(queue, k)
            ch.exchange_declare(name, "topic", durable=True)
            self._declare(link, name, c.delay_arguments(queue, k))
            ch.queue_bind(name, name, routing_key=wire.bit_pattern(k, "1"))
            if k == 0:
                ch.queue_bind(c.queue(queue), name, routing_key=wire.bit_pattern(0, "0"))
            else:
                ch.exchange_bind(c.delay(queue, k - 1), name, wire.bit_pattern(k, "0"))
        link.delays[queue] = (top, when if have >= 0 else time.monotonic())

    def _route(self, link: _Link, item: Outgoing) -> tuple[str, str]:
        if item.fanout:  # a Broadcast group: its fanout exchange, as kombu declares it
            name = self.config.queue(item.queue)
            if name not in link.exchanges:
                link.admin().exchange_declare(name, "fanout", durable=True)
                link.exchanges.add(name)
            return name, name
        target = self.config.queue(item.queue)
        if self.config.kombu and target not in link.queues:
            # Celery's declarations of a queue: an exchange of its name, bound by it.
            self._declare(link, target, self.config.queue_arguments())
            link.admin().exchange_declare(target, "direct", durable=True)
            link.admin().queue_bind(target, target, routing_key=target)
        self._declare(link, target, self.config.queue_arguments())
        route = wire.delay_route(item.delay) if item.delay and item.delay > 0 else None
        if route is None:
            return "", target
        top, bits = route
        self._declare_delays(link, item.queue, top)
        return self.config.delay(item.queue, top), bits

    # -- publishing -----------------------------------------------------------------------
    def _send(self, link: _Link, sends: dict[int, _Send], left: list[int]) -> None:
        """Publish ``sends[i]`` for each ``i`` in ``left`` and wait for the confirms. On
        return or exception, ``left`` holds the indices that were not confirmed."""
        ch = link.channel()
        tags: dict[int, int] = {}
        try:
            for i in left:
                exchange, key, body, props, mandatory = sends[i]
                # Outstanding before the publish: pika reads the socket while it writes,
                # so the confirm can arrive inside basic_publish.
                link.next_tag += 1
                link.outstanding.add(link.next_tag)
                tags[i] = link.next_tag
                ch.basic_publish(exchange, key, body, _Encoded(props), mandatory=mandatory)
            link.pump(lambda: not link.outstanding, CONFIRM_TIMEOUT)
        finally:
            returned, link.returned = link.returned, []
            failed = link.outstanding | link.nacked
            link.nacked.clear()
            keep = []
            for i in left:
                ident = (*sends[i][:3],)
                if ident in returned:
                    returned.remove(ident)
                    link.queues.clear()  # a queue we declared was deleted since: again
                    link.delays.clear()
                    keep.append(i)
                elif i not in tags or tags[i] in failed:
                    keep.append(i)
            left[:] = keep
        if left:
            raise _Retry(f"{len(left)} message(s) not confirmed by the broker")

    def publish_many(self, items: Sequence[Outgoing]) -> None:
        left = list(range(len(items)))

        # Encoded before anything is sent: a header that cannot go out publishes nothing.
        props = [wire.encode_properties(wire.wire_properties(i.message)) for i in items]

        def op(link: _Link) -> None:
            routes = {i: self._route(link, items[i]) for i in left}  # declare, then publish
            # A fanout with no queue bound is dropped, as RabbitMQ does for kombu's.
            sends = {i: (*routes[i], items[i].message.body, props[i], not items[i].fanout)
                     for i in left}
            self._send(link, sends, left)

        if left:
            self.call("publish", op)

    def broadcast(self, channel: str, payload: bytes, routing_key: str = "") -> None:
        name, kind, key = self.config.broadcast_route(channel)
        props = wire.encode_properties({"delivery_mode": 1})  # not stored

        def op(link: _Link) -> None:
            if name not in link.exchanges:
                link.admin().exchange_declare(name, kind, durable=True)
                link.exchanges.add(name)
            self._send(link, {0: (name, routing_key if key is None else key, payload,
                                  props, False)}, [0])

        self.call("broadcast", op)

    # -- administration -------------------------------------------------------------------
    def ping(self) -> None:
        def op(link: _Link) -> None:
            link.admin().exchange_declare("amq.direct", "direct", passive=True, durable=True)

        try:
            self.call("ping", op, retry=False)
        except OperationalError as exc:
            raise BrokerUnavailable(str(exc)) from exc

    def _count(self, link: _Link, name: str, purge: bool) -> int | None:
        """Messages ready in queue ``name`` (purged if ``purge``); None if there is none."""
        _QUIET.on = True  # a 404 is an answer here, not worth pika's warning
        try:
            if purge:
                return int(link.admin().queue_purge(name).method.message_count)
            return int(link.admin().queue_declare(name, passive=True).method.message_count)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code == 404:
                return None
            raise
        finally:
            _QUIET.on = False

    def queue_length(self, queue: str) -> int:
        return self.call("queue_length", lambda link: self._count(
            link, self.config.queue(queue), purge=False) or 0)

    def purge(self, queue: str) -> int:
        def op(link: _Link) -> int:
            total = self._count(link, self.config.queue(queue), purge=True) or 0
            # Levels are declared from 0 up and expire from the top down: the first
            # missing one is the end.
            for level in range(wire.DELAY_LEVELS):
                found = self._count(link, self.config.delay(queue, level), purge=True)
                if found is None:
                    break
                total += found
            return total

        return self.call("purge", op)

    def purge_dead(self) -> int:
        def op(link: _Link) -> int:
            self._declare(link, self.config.dead, self.config.dead_arguments())
            return self._count(link, self.config.dead, purge=True) or 0

        return self.call("purge_dead", op)
