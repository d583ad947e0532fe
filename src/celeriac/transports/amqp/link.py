"""The worker's side of the AMQP transport: one connection (a ``Link``) on the worker's
event loop, and broadcast subscriptions.

aiormq is aio-pika's AMQP engine, used here without aio-pika's object layer: a delivery
costs one task instead of two, acks work on raw delivery tags (``multiple``), and a
connection left open when its event loop ends closes without leaving aio-pika's
callback tasks pending on a closed loop.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import aiormq
import aiormq.exceptions
from aiormq.abc import AbstractChannel, AbstractConnection, DeliveredMessage
from pamqp import commands as spec
from yarl import URL

from ...errors import BrokerUnavailable, CeleriacError, OperationalError
from ...protocol import DECODE_ERROR_HEADER, Message
from ..base import DeadLetter, Subscription
from . import tolerant, wire

if TYPE_CHECKING:
    from ...settings import Settings

logger = logging.getLogger("celeriac.transports.amqp")

BROKEN = (aiormq.exceptions.AMQPError, ConnectionError, OSError, asyncio.TimeoutError)
_PER_CONSUMER_TIMEOUT = (3, 11, 15)
_generations = itertools.count(1)
_warned = False  # about x-consumer-timeout, once per process

tolerant.install()  # one bad byte in a header must not crash-loop the connection


class Encoded(spec.Basic.Properties):
    """Properties encoded by ``wire``: pamqp writes floats as 32-bit 'f' (lossy)."""

    def __init__(self, raw: bytes) -> None:
        super().__init__()
        self.raw = raw

    def marshal(self) -> bytes:
        return self.raw


@dataclass(frozen=True, slots=True)
class Tag:
    """``Delivery.tag``: which connection delivered it, and its delivery tag there."""

    generation: int
    tag: int


@dataclass(slots=True)
class Held:
    """A delivery of the current link, not settled yet."""

    tag: int
    queue: str
    message: Message
    count: int
    props: Any
    """As received: copies are published from these, not from the (mutable) message."""
    body: bytes
    checkpoint: bool
    """Classic redelivery: publish it again with its count before anyone runs it."""

    @classmethod
    def receive(cls, msg: DeliveredMessage, queue: str) -> Held:
        delivery = cast(spec.Basic.Deliver, msg.delivery)
        tag, redelivered = int(delivery.delivery_tag or 0), bool(delivery.redelivered)
        props = msg.header.properties
        try:
            incoming = wire.from_wire(props, msg.body)
        except Exception as exc:  # still deliver it: the worker dead-letters it
            message = Message({DECODE_ERROR_HEADER: f"undecodable AMQP headers: {exc}"},
                              bytes(msg.body), "application/data")
            return cls(tag, queue, message, 1, props, msg.body, False)
        return cls(tag, queue, incoming.message, incoming.delivery_count(redelivered), props,
                   msg.body, incoming.returns is None and redelivered)


class Link:
    """One connection: a consuming channel, a confirm-mode channel for copies and
    declarations, and the delivery tags not settled yet. Each link is a generation:
    once it is lost, nothing it delivered is acked through another."""

    def __init__(self, conn: AbstractConnection, consuming: AbstractChannel,
                 ops: AbstractChannel, on_lost: Callable[[], None]) -> None:
        self.generation = next(_generations)
        self.conn = conn
        self.consuming: Any = consuming  # Any: aiormq's abc lacks ``consumers``
        self.ops = ops
        self.on_lost = on_lost
        self.broken: str | None = None
        self.unacked: set[int] = set()
        self.declared: set[str] = set()
        conn.closing.add_done_callback(self._lost)
        consuming.closing.add_done_callback(self._lost)

    @classmethod
    async def open(cls, config: wire.Config, settings: Settings, name: str,
                   on_lost: Callable[[], None]) -> Link:
        failures = []
        for url in config.ordered():
            target = URL(url)
            if "heartbeat" not in target.query:
                target = target.update_query(heartbeat=config.heartbeat)
            conn: AbstractConnection | None = None
            try:
                async with asyncio.timeout(settings.broker_connection_timeout):
                    conn = await aiormq.connect(target,
                                                client_properties={"connection_name": name})
                consuming = await conn.channel(publisher_confirms=False)
                ops = await conn.channel(publisher_confirms=True)
            except BROKEN as exc:
                failures.append(f"{wire.masked(url)}: {wire.describe(exc)}")
                if conn is not None:
                    await conn.close()
                continue
            logger.info("connected to %s", wire.masked(url))
            _check_version(conn)
            return cls(conn, consuming, ops, on_lost)
        raise BrokerUnavailable("cannot reach the broker: " + "; ".join(failures))

    @property
    def alive(self) -> bool:
        return self.broken is None and not self.conn.is_closed

    def _lost(self, closing: asyncio.Future[Any]) -> None:
        exc = None if closing.cancelled() else closing.exception()
        self._mark(wire.describe(exc) if exc is not None else "closed")

    def _mark(self, reason: str) -> bool:
        """Record the link as lost (and wake the fetch); False if it was already."""
        if self.broken is not None:
            return False
        self.broken = reason
        self.on_lost()
        return True

    async def close(self) -> None:
        self.broken = self.broken or "closed"  # not lost: nobody to wake
        if not self.conn.is_closed:
            try:
                await self.conn.close()
            except BROKEN as exc:
                logger.debug("closing the connection: %s", exc)

    async def declare(self, name: str, arguments: dict[str, Any]) -> None:
        if name in self.declared:
            return
        try:
            await self.ops.queue_declare(name, durable=True, arguments=arguments)
        except aiormq.exceptions.ChannelPreconditionFailed as exc:
            # Declared before with other arguments (a Celery worker, an older setting).
            logger.warning("queue %r exists with other arguments (%s); using it as it is",
                           name, exc)
            self.ops = await self.conn.channel(publisher_confirms=True)
            await self.ops.queue_declare(name, passive=True)
        self.declared.add(name)

    async def ack(self, tags: set[int]) -> None:
        tags &= self.unacked
        if not tags or not self.alive:
            return  # a lost connection's deliveries were taken back by the broker
        others = self.unacked - tags
        self.unacked -= tags
        low = min(others, default=2 ** 64)
        below = sorted(t for t in tags if t < low)
        try:
            if below:  # one frame for the run of tags below every other unacked tag
                await self.consuming.basic_ack(below[-1], multiple=len(below) > 1)
            for tag in sorted(t for t in tags if t > low):
                await self.consuming.basic_ack(tag)
        except BROKEN as exc:
            if self._mark(wire.describe(exc)):  # once: the acks in flight all fail alike
                logger.warning("ack failed (%s); the broker will deliver again", exc)

    async def publish(self, items: Sequence[tuple[str, bytes, bytes]]) -> bool:
        """Publish (queue, body, encoded properties) and wait for every confirm; False if
        the connection failed meanwhile (the broker then returns the originals)."""
        try:
            confirms = await asyncio.gather(*(
                self.ops.basic_publish(body, exchange="", routing_key=queue,
                                       properties=Encoded(props))
                for queue, body, props in items))
        except BROKEN as exc:
            logger.warning("publishing %d message(s) again failed (%s); the broker will "
                           "deliver the originals again", len(items), exc)
            return False
        if not all(isinstance(c, spec.Basic.Ack) for c in confirms):
            raise OperationalError("the broker refused a message published again (nack)")
        return True


def _check_version(conn: AbstractConnection) -> None:
    global _warned
    raw = (conn.server_properties or {}).get("version", b"")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    try:
        version = tuple(int(p) for p in text.split(".")[:3])
    except ValueError:
        return
    if version < _PER_CONSUMER_TIMEOUT and not _warned:
        _warned = True
        logger.warning(
            "RabbitMQ %s ignores x-consumer-timeout: a task running longer than the server's "
            "consumer_timeout (30 min by default) is taken back and run again; raise "
            "consumer_timeout in rabbitmq.conf", text)


def process_name(consumer_id: str | None) -> str:
    return f"celeriac worker {consumer_id or os.getpid()}"


def dead_letter_admin(config: wire.Config, settings: Settings, limit: int | None,
                      wanted: set[str] | None, *, requeue: bool) -> tuple[list[DeadLetter], int]:
    """``dead_letters`` for synchronous callers: on an event loop of its own, in a
    thread, as the caller may be running one already."""
    result: list[tuple[list[DeadLetter], int]] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(asyncio.run(dead_letters(config, settings, limit, wanted,
                                                   requeue=requeue)))
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=run, name="celeriac-amqp-dead-letters")
    thread.start()
    thread.join()
    if failure:
        if isinstance(failure[0], CeleriacError):
            raise failure[0]
        where = ", ".join(wire.masked(u) for u in config.urls)
        raise OperationalError(f"reading dead letters on {where} failed: "
                               f"{wire.describe(failure[0])}") from failure[0]
    return result[0]


async def dead_letters(config: wire.Config, settings: Settings, limit: int | None,
                       wanted: set[str] | None, *, requeue: bool) -> tuple[list[DeadLetter], int]:
    """Dead letters, oldest first, read without taking them: they stay unacked on a
    channel of their own, and closing the connection puts back whatever was not acked,
    in place. The ``wanted`` ids are acked: removed, or, with ``requeue``, published
    back to their queues (delivery count reset) first. Returns (letters, acked)."""
    link = await Link.open(config, settings, f"celeriac admin {os.getpid()}", lambda: None)
    try:
        await link.declare(config.dead, config.dead_arguments())
        ch = await link.conn.channel(publisher_confirms=False)
        found: list[tuple[int, DeadLetter, DeliveredMessage]] = []
        while limit is None or len(found) < limit:
            msg = await ch.basic_get(config.dead)
            if not isinstance(msg.delivery, spec.Basic.GetOk):
                break
            letter = wire.dead_letter(msg.header.properties, msg.body)
            found.append((int(msg.delivery.delivery_tag or 0), letter, msg))
        letters = [letter for _, letter, _ in found]
        chosen = [(t, d, m) for t, d, m in found if wanted is not None and str(d.id) in wanted]
        if requeue and chosen:
            for _, d, _ in chosen:
                await link.declare(config.queue(d.queue), config.queue_arguments())
            if not await link.publish([
                    (config.queue(d.queue), m.body,
                     wire.encode_properties(wire.republished(m.header.properties, 0)))
                    for _, d, m in chosen]):
                raise BrokerUnavailable("lost the connection while requeueing dead letters")
        for tag, _, _ in chosen:
            await ch.basic_ack(tag)
        return letters, len(chosen)
    finally:
        await link.close()


class AMQPSubscription(Subscription):
    """An exclusive, server-named queue bound to the channel's exchange (a fanout one,
    or for a private channel the reply exchange, by the channel's key)."""

    def __init__(self, link: Callable[[], Awaitable[Link]], exchange: str,
                 kind: str = "fanout", key: str | None = None, durable: bool = True) -> None:
        self.link = link
        self.exchange = exchange
        self.kind = kind
        self.key = key
        self.durable = durable  # as Celery declares its exchange (kombu layout)
        self.channel: AbstractChannel | None = None
        self.payloads: asyncio.Queue[bytes] = asyncio.Queue()

    async def open(self) -> None:
        link = await self.link()
        ch = self.channel = await link.conn.channel(publisher_confirms=False)
        await ch.exchange_declare(self.exchange, exchange_type=self.kind,
                                  durable=self.durable)
        ok = await ch.queue_declare("", exclusive=True, auto_delete=True)
        await ch.queue_bind(str(ok.queue), self.exchange, routing_key=self.key or "")
        await ch.basic_consume(str(ok.queue), self._on_message, no_ack=True)

    async def _on_message(self, msg: DeliveredMessage) -> None:
        self.payloads.put_nowait(bytes(msg.body))

    async def get(self, timeout: float) -> bytes | None:
        deadline = time.monotonic() + timeout
        while self.channel is None or self.channel.is_closed:
            try:
                await self.open()  # reconnected: what was broadcast meanwhile is gone
            except (*BROKEN, BrokerUnavailable) as exc:
                logger.debug("subscription to %s: %s", self.exchange, exc)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                await asyncio.sleep(min(remaining, 0.5))
        if not self.payloads.empty():
            return self.payloads.get_nowait()
        try:  # asyncio.timeout: wait_for can drop a payload or a cancellation on 3.11
            async with asyncio.timeout(max(deadline - time.monotonic(), 0)):
                return await self.payloads.get()
        except TimeoutError:
            return None

    async def close(self) -> None:
        channel, self.channel = self.channel, None
        if channel is not None and not channel.is_closed:
            try:
                await channel.close()
            except BROKEN as exc:
                logger.debug("closing subscription to %s: %s", self.exchange, exc)

