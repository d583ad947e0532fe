"""RabbitMQ (``amqp://``, ``amqps://``). The worker side is here, on aiormq (aio-pika's
engine, ``link.py``); producers and administration on pika (``client.py``);
names, arguments and the wire form in ``wire.py``.

**Wire.** Celery's protocol v2 as it is, no envelope: ``Message.headers`` is the AMQP
headers table (encoded as py-amqp does), content type/encoding, correlation id, reply-to
and priority are AMQP properties, the body is untouched, every message is persistent.

**Exchanges.** Durable queues, published to through the default exchange with the
queue's name as routing key: one hop, no exchange per queue. A Celery producer declares
its own direct exchange and binding, so both reach the same queue; it must declare the
same queue arguments (``task_queue_max_priority = 10``; or quorum). A queue found
declared otherwise is used as it is, with a warning. URL ``namespace`` prefixes names.

**Queue types.** Classic by default, with ``x-max-priority=10`` (celeriac uses 0-9);
``broker_transport_options={"queue_type": "quorum"}`` for quorum queues, which on
RabbitMQ 3.10 (installed here) have no priorities (refused; 4.0 adds two levels), no
channel-wide prefetch (so the prefetch is per consumer and only grows: up to the largest
``fetch`` limit seen may wait in the buffer), ``x-delivery-count``, message TTL and
at-least-once dead-lettering (used by the delay queues).

**Fetch.** ``basic.consume`` on each queue feeds a local buffer. On classic queues the
channel-wide prefetch is what the caller holds plus ``limit``, so the broker hands out no
more than was asked. When it grows, the fetch waits for the batch it released: while a
queue has ready messages and there is room (passive ``queue.declare``), then a few ms for
deliveries still on the way. Priority is per queue: across queues the broker interleaves,
and nothing on the wire tells publish order across queues.

**Leases** are connections: RabbitMQ returns a consumer's unacked messages when its
connection closes or misses two heartbeats, and the heartbeat is ``worker_lease_timeout /
2``. ``renew_lease()`` returns 0. A live connection's long task is never taken back:
consumers ask for ``x-consumer-timeout`` 2**31-1 ms; RabbitMQ < 3.11.15 ignores it and
applies its global ``consumer_timeout`` (30 min by default; we warn at connect).

**Delivery counts.** The header ``x-celeriac-deliveries`` carries the deliveries counted
before a copy was published. ``requeue(redelivered=True)`` publishes a copy with the count
and acks the original. ``requeue(redelivered=False)`` and ``disconnect()`` publish a copy
with the count unchanged: a nack would set the redelivered flag, so AMQP cannot put a
message back in place uncounted; a given-back message goes to the back of its priority.
A message taken back from a lost connection counts one more: quorum queues say so in
``x-delivery-count``; on classic queues the redelivered flag cannot tell a second loss,
so the next consumer publishes it again with its count before anyone runs it.

**Delays** stay in the broker, per queue, in 31 TTL queues: level k holds a message 2**k
ms, then dead-letters it to the topic exchange of level k-1, which routes on bit k-1 of
the routing key (the delay in binary); level 0 and the 0 bits lead to the queue. Exact to
1 ms, at most 31 hops (kombu's native delays work alike), fixed names so that ``purge``
empties them, x-expires (49.7 days) for levels nobody uses.

**Dead letters** go to ``<ns>celeriac.dead``: the message plus ``x-celeriac-reason``,
``-queue``, ``-deliveries``, ``-dead-at`` and ``-dead-id``. Admin calls read them with
``basic.get`` without acking, then close the channel.

**Reconnection.** ``fetch`` reconnects (failover across ``;``-separated URLs) or raises
``BrokerUnavailable``, and the consumer backs off. Each connection is a generation: what
an older one delivered was returned by the broker, and acks for it are ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import aiormq
from aiormq.abc import DeliveredMessage

from ...clients.net import backoff
from ...errors import BrokerUnavailable
from ...protocol import Delivery
from ...settings.routing import Routing
from ..base import DeadLetter, Outgoing, Subscription, Transport
from . import wire
from .client import SyncClient
from .link import (
    BROKEN,
    AMQPSubscription,
    Held,
    Link,
    Tag,
    dead_letter_admin,
    process_name,
)

if TYPE_CHECKING:
    from ...settings import Settings

logger = logging.getLogger("celeriac.transports.amqp")

_MAX_PREFETCH = 65535  # basic.qos prefetch-count is a short
_SETTLE = 0.02
"""Seconds a fetch waits for the next delivery of a batch the broker is still sending."""
_QUIET = 0.005
"""...and, once the queue has no ready message, for deliveries still on their way."""


class AMQPTransport(Transport):
    scheme = "amqp"
    fanout = True

    def __init__(self, url: str, settings: Settings) -> None:
        super().__init__(url, settings)
        self.config = wire.Config.from_settings(url, settings)
        self.client = SyncClient(self.config, settings)
        self._link: Link | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._fanout: dict[str, str] = {}
        """This worker's fanout queues -> their groups (declared at each consume)."""
        self._topics = {q.name: (q.exchange, q.routing_key)
                        for q in Routing(settings).declared if q.kind == "topic"}
        """Topic queues of task_queues -> (exchange, pattern): bound where consumed, so a
        Celery producer's publish to the exchange reaches them too (celeriac's own
        producers route by the pattern themselves and publish to the queues)."""
        self._reset()

    def _reset(self) -> None:
        self._consumers: dict[str, str] = {}  # queue -> consumer tag
        self._buffer: deque[Held] = deque()
        self._owned: dict[int, Held] = {}
        self._prefetch = 0

    # -- producer and administration (pika) ---------------------------------------------
    def publish_many(self, items: Sequence[Outgoing]) -> None:
        for item in items:
            self.check_size(item.message)
        self.client.publish_many(items)

    def broadcast(self, channel: str, payload: bytes, routing_key: str = "") -> None:
        self.client.broadcast(channel, payload, routing_key)

    def ping(self) -> None:
        self.client.ping()

    def queue_length(self, queue: str) -> int:
        return self.client.queue_length(queue)

    def purge(self, queue: str) -> int:
        return self.client.purge(queue)

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        return dead_letter_admin(self.config, self.settings, limit, None, requeue=False)[0]

    def requeue_dead(self, ids: Sequence[int | str]) -> int:
        wanted = {str(i) for i in ids}
        return dead_letter_admin(self.config, self.settings, None, wanted, requeue=True)[1] \
            if wanted else 0

    def purge_dead(self, ids: Sequence[int | str] | None = None) -> int:
        if ids is None:
            return self.client.purge_dead()
        wanted = {str(i) for i in ids}
        return dead_letter_admin(self.config, self.settings, None, wanted, requeue=False)[1] \
            if wanted else 0

    # -- the connection -------------------------------------------------------------------
    async def connect(self, consumer_id: str) -> None:
        await super().connect(consumer_id)
        attempt = 0
        while True:
            try:
                await self._ready()
                return
            except BrokerUnavailable as exc:
                attempt += 1
                limit = self.settings.broker_connection_max_retries
                if not self.settings.broker_connection_retry or (
                        limit is not None and attempt > limit):
                    raise
                delay = backoff(attempt)
                logger.warning("%s; retry %d in %.1fs", exc, attempt, delay)
                await asyncio.sleep(delay)

    async def _ready(self) -> Link:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._pid != os.getpid():
            # Another event loop (asyncio.run again) or a forked child: what the old
            # loop holds can be neither used nor closed from here.
            self._link, self._loop, self._pid = None, loop, os.getpid()
            self._lock, self._wake = asyncio.Lock(), asyncio.Event()
            self._reset()
        async with self._lock:
            if self._link is None or not self._link.alive:
                await self._teardown()
                self._link = await Link.open(self.config, self.settings,
                                             process_name(self.consumer_id), self._wake.set)
        return self._link

    async def _teardown(self) -> None:
        link, self._link = self._link, None
        self._reset()
        if link is not None:
            await link.close()

    def _current(self, deliveries: Sequence[Delivery]) -> tuple[Link | None, list[Held]]:
        """Take the deliveries that the current link still owns out of ``_owned``; a
        lost link's were taken back by the broker, and are ignored."""
        link = self._link
        if link is None or self._loop is not asyncio.get_running_loop():
            return None, []
        out = []
        for d in deliveries:
            tag = d.tag
            if (isinstance(tag, Tag) and tag.generation == link.generation
                    and tag.tag in self._owned):
                out.append(self._owned.pop(tag.tag))
        return link, out

    # -- fetching -------------------------------------------------------------------------
    async def fetch(self, queues: Sequence[str], limit: int, timeout: float) -> list[Delivery]:
        deadline = time.monotonic() + timeout
        link = await self._ready()
        wanted = set(queues)
        try:
            if await self._prepare(link, queues, wanted, max(limit, 1)):
                await self._settle(link, queues, wanted, limit, deadline)
        except BROKEN as exc:
            raise BrokerUnavailable(f"lost the connection to the broker: {exc!r}") from exc
        while True:
            self._wake.clear()  # before taking: a delivery during an await wakes the wait
            out = await self._take(link, wanted, limit)
            if out:
                return out
            if not link.alive:
                raise BrokerUnavailable(f"lost the connection to the broker: {link.broken}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            # asyncio.timeout, not wait_for: on 3.11 wait_for loses a cancellation that
            # lands as the event is set, and a worker's stop would wait on fetch forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._wake.wait()

    async def _prepare(self, link: Link, queues: Sequence[str], wanted: set[str],
                       limit: int) -> bool:
        """Set the prefetch limit and consume ``queues``; True when that may release
        deliveries."""
        ch, grew = link.consuming, False
        # The prefetch limit is set before consuming: a consumer on a channel without one
        # would be handed the whole queue.
        if self.config.quorum:
            if limit > self._prefetch:  # per consumer: consume again with the new limit
                for tag in self._consumers.values():
                    await ch.basic_cancel(tag)
                self._consumers.clear()
                self._prefetch = min(limit, _MAX_PREFETCH)
                await ch.basic_qos(prefetch_count=self._prefetch, global_=False)
        else:
            buffered = sum(1 for h in self._buffer if h.queue in wanted)
            want = min(len(link.unacked) - buffered + limit, _MAX_PREFETCH)
            # Lowered only when well below: a worker's acks trail its fetches by a loop
            # iteration, and a prefetch limit set on every fetch costs a round trip each.
            if want > self._prefetch or want < self._prefetch * 3 // 4:
                grew = want > self._prefetch
                self._prefetch = want
                await ch.basic_qos(prefetch_count=want, global_=True)
        for queue in queues:
            if self._consumers.get(queue) in ch.consumers:
                continue
            if queue in self._fanout:
                await self._declare_fanout(link, queue, self._fanout[queue])
            else:
                await link.declare(self.config.queue(queue), self.config.queue_arguments())
                if queue in self._topics:
                    await self._bind_topic(link, queue, *self._topics[queue])
            if self.config.kombu and queue not in self._fanout:
                # Celery's exchange and binding of the queue
                name = self.config.queue(queue)
                await link.ops.exchange_declare(name, exchange_type="direct", durable=True)
                await link.ops.queue_bind(name, name, routing_key=name)
            # Known before it starts: a fetch cancelled meanwhile must still cancel it.
            tag = self._consumers[queue] = f"celeriac-{uuid.uuid4().hex}"
            await ch.basic_consume(self.config.queue(queue), self._on_message(link, queue),
                                   consumer_tag=tag,
                                   arguments={"x-consumer-timeout": self.config.consumer_timeout})
            grew = True
        return grew

    async def bind_fanout(self, group: str, queue: str) -> None:
        self._fanout[queue] = group
        await self._declare_fanout(await self._ready(), queue, group)

    async def _bind_topic(self, link: Link, queue: str, exchange: str, pattern: str) -> None:
        try:
            await link.ops.exchange_declare(self.config.queue(exchange),
                                            exchange_type="topic", durable=True)
            await link.ops.queue_bind(self.config.queue(queue), self.config.queue(exchange),
                                      routing_key=pattern)
        except aiormq.exceptions.ChannelPreconditionFailed as exc:
            # Declared otherwise by someone else: our own producers do not need it.
            logger.warning("exchange %r exists as another type (%s); queue %r is not bound "
                           "to it", exchange, exc, queue)
            link.ops = await link.conn.channel(publisher_confirms=True)

    async def _declare_fanout(self, link: Link, queue: str, group: str) -> None:
        # kombu's Broadcast: a fanout exchange named after the group, and per worker an
        # auto-delete queue bound to it (gone when the worker's connection is), declared
        # again on every new connection. Classic, whatever queue_type says: quorum
        # queues cannot auto-delete.
        name, exchange = self.config.queue(queue), self.config.queue(group)
        self.client.auto_delete.add(name)
        if name in link.declared:
            return
        await link.ops.exchange_declare(exchange, exchange_type="fanout", durable=True)
        await link.ops.queue_declare(name, durable=True, auto_delete=True,
                                     arguments={"x-max-priority": wire.MAX_PRIORITY})
        await link.ops.queue_bind(name, exchange, routing_key="")
        link.declared.add(name)

    async def _settle(self, link: Link, queues: Sequence[str], wanted: set[str], limit: int,
                      deadline: float) -> None:
        """Wait for the deliveries a new prefetch limit released, so that one fetch
        returns the whole batch: while a queue has ready messages and there is room, wait
        for more (up to _SETTLE for each); once it has none, for what it sent before
        answering (its answer may overtake its last deliveries by a moment)."""
        while self._room(wanted, limit) and link.alive:
            ready = 0
            for queue in queues:
                ok = await link.consuming.queue_declare(self.config.queue(queue), passive=True)
                ready += int(ok.message_count or 0)
            pause = _SETTLE if ready else _QUIET
            while self._room(wanted, limit):
                self._wake.clear()
                try:
                    async with asyncio.timeout(min(pause, deadline - time.monotonic())):
                        await self._wake.wait()
                except TimeoutError:
                    return  # quiet, or no room after all (another consumer, acks in flight)
                if ready:
                    break  # ask again how many are left

    def _room(self, wanted: set[str], limit: int) -> bool:
        return sum(1 for h in self._buffer if h.queue in wanted) < limit

    def _on_message(self, link: Link, queue: str
                    ) -> Callable[[DeliveredMessage], Awaitable[None]]:
        async def on_message(msg: DeliveredMessage) -> None:
            if link is not self._link:
                return  # a lost link's: the broker has taken it back already
            held = Held.receive(msg, queue)
            self._buffer.append(held)
            link.unacked.add(held.tag)
            self._wake.set()

        return on_message

    async def _take(self, link: Link, wanted: set[str], limit: int) -> list[Delivery]:
        picked: list[Held] = []
        again: list[Held] = []
        for held in sorted((h for h in self._buffer if h.queue in wanted),
                           key=lambda h: -h.message.priority):
            if held.checkpoint:
                again.append(held)
            elif len(picked) < limit:
                picked.append(held)
        if picked or again:
            gone = {id(h) for h in picked + again}
            self._buffer = deque(h for h in self._buffer if id(h) not in gone)
        for held in picked:
            self._owned[held.tag] = held
        if again:
            await self._copy(link, [(h, self.config.queue(h.queue), h.count - 1, None)
                                    for h in again])
        return [Delivery(h.message, h.queue, Tag(link.generation, h.tag), h.count)
                for h in picked]

    # -- settling -------------------------------------------------------------------------
    async def _copy(self, link: Link,
                    items: Sequence[tuple[Held, str, int, dict[str, Any] | None]]) -> None:
        """Publish a copy of each held message to a queue with its delivery count (and
        dead-letter headers); once the broker confirmed them all, ack the originals."""
        if items and await link.publish([
                (queue, held.body, wire.encode_properties(wire.republished(held.props, n, x)))
                for held, queue, n, x in items]):
            await link.ack({held.tag for held, *_ in items})

    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        link, held = self._current(deliveries)
        if link is not None:
            await link.ack({h.tag for h in held})

    async def requeue(self, deliveries: Sequence[Delivery], *, redelivered: bool,
                      delay: float = 0.0) -> None:
        link, held = self._current(deliveries)
        if link is None or not held:
            return
        if delay > 0:
            # The producer's client declares and routes the delay levels; it blocks, so a
            # thread of its own. Once the copies are confirmed the originals are acked;
            # if that fails, the broker hands the originals out again.
            copies = []
            for h in held:
                n = h.count if redelivered else h.count - 1
                message = wire.from_wire(h.props, h.body).message
                if n > 0:
                    message = message.with_headers(**{wire.DELIVERIES: n})
                copies.append(Outgoing(h.queue, message, delay))
            await asyncio.to_thread(self.client.publish_many, copies)
            await link.ack({h.tag for h in held})
            return
        await self._copy(link, [(h, self.config.queue(h.queue),
                                 h.count if redelivered else h.count - 1, None)
                                for h in held])

    async def dead_letter(self, delivery: Delivery, reason: str) -> None:
        link, held = self._current([delivery])
        if link is not None and held:
            await link.declare(self.config.dead, self.config.dead_arguments())
            h = held[0]
            extra = {wire.DEAD_REASON: reason, wire.DEAD_QUEUE: h.queue,
                     wire.DEAD_AT: time.time(), wire.DEAD_ID: uuid.uuid4().hex,
                     wire.DELIVERIES: h.count}
            await self._copy(link, [(h, self.config.dead, 0, extra)])

    async def renew_lease(self) -> int:
        return 0  # the AMQP heartbeat keeps the lease: see the module docstring

    async def disconnect(self) -> None:
        link = self._link
        if link is None or self._loop is not asyncio.get_running_loop():
            return
        if link.alive:
            try:
                # Stop deliveries first, or the copies given back come straight back here.
                for tag in self._consumers.values():
                    await link.consuming.basic_cancel(tag)
                held = [*self._owned.values(), *self._buffer]
                await self._copy(link, [(h, self.config.queue(h.queue), h.count - 1, None)
                                        for h in held])
            except BROKEN as exc:
                logger.warning("giving messages back failed (%s); the broker returns them", exc)
        await self._teardown()

    async def release(self) -> None:
        if self._link is not None and self._loop is asyncio.get_running_loop():
            await self._teardown()

    # -- broadcast ------------------------------------------------------------------------
    async def subscribe(self, channel: str) -> Subscription:
        sub = AMQPSubscription(self._ready, *self.config.broadcast_route(channel))
        await sub.open()
        return sub

    def close(self) -> None:
        self.client.close()
        loop = self._loop
        if self._link is None or loop is None or loop.is_closed():
            return  # a closed loop's connection went with its tasks
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            loop.create_task(self._teardown())
        elif loop.is_running():
            asyncio.run_coroutine_threadsafe(self._teardown(), loop)
        else:
            loop.run_until_complete(self._teardown())
