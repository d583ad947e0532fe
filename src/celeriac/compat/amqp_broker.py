"""RabbitMQ in Celery's layout (``amqp://...?layout=kombu``): ``AMQPTransport`` with its
task queues declared as Celery declares them (``wire.Config.kombu``), and its broadcast
channels on Celery's exchanges, so ``celery inspect``, ``celery events`` and Flower see
celeriac workers, and celeriac's monitors and ``app.control`` see Celery's
(``channels.py`` routes the channels; this module carries them).

On RabbitMQ kombu's exchanges are real ones, and a declaration must equal the first one
argument for argument, or the broker closes the second declarer's channel
(``PRECONDITION_FAILED``). Celery declares:

- ``celeryev``: topic, durable, not auto-deleted; each receiver binds an exclusive
  queue of its own with ``#`` (Celery's has a 5 s message TTL and a 60 s expiry; ours is
  server-named and goes with its connection).
- ``celery.pidbox``: fanout, **not durable**; each worker binds
  ``<hostname>.celery.pidbox``; a celeriac worker binds a server-named exclusive queue.
- ``reply.celery.pidbox``: direct, **not durable**; a caller binds its reply queue by its
  key; ours is server-named and exclusive, bound by the call's ticket.

Messages are JSON with ``content_type`` ``application/json``, transient
(``delivery_mode`` 1), with kombu's headers (``ticket`` on replies, ``clock`` and
``expires`` on commands). Publishing goes through the producer's pika client, with
publisher confirms like every publish of this transport, so a broadcast that returns
was taken by the broker; subscriptions are the worker loop's aiormq channels.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..transports.amqp import wire
from ..transports.amqp.link import AMQPSubscription
from ..transports.amqp.transport import AMQPTransport
from ..transports.base import Subscription
from .channels import CeleryChannels, KombuExchanges
from .kombu_wire import Exchange

if TYPE_CHECKING:
    from ..settings import Settings
    from ..transports.amqp.client import _Link

logger = logging.getLogger("celeriac.transports.amqp.kombu")


class AMQPExchanges(KombuExchanges):
    """Celery's exchanges on the RabbitMQ of ``transport``."""

    def __init__(self, transport: AMQPTransport) -> None:
        self.transport = transport

    def publish(self, exchange: Exchange, routing_key: str, body: bytes,
                headers: Mapping[str, Any]) -> None:
        client = self.transport.client
        props = wire.encode_properties({
            "content_type": "application/json", "content_encoding": "utf-8",
            "headers": dict(headers), "delivery_mode": 1})

        def op(link: _Link) -> None:
            if exchange.name not in link.exchanges:
                link.admin().exchange_declare(exchange.name, exchange.type,
                                              durable=exchange.durable)
                link.exchanges.add(exchange.name)
            # The client's confirmed send, as its own broadcast uses (a private method).
            client._send(link, {0: (exchange.name, routing_key, body, props, False)}, [0])

        client.call("broadcast", op)

    async def subscribe(self, exchange: Exchange, binding_key: str) -> Subscription:
        sub = AMQPSubscription(self.transport._ready, exchange.name, exchange.type,
                               binding_key, durable=exchange.durable)
        await sub.open()
        return sub

    async def consume(self, exchange: Exchange, routing_key: str, queue: str
                      ) -> Subscription:
        # A server-named exclusive queue rather than kombu's ``queue``: it goes with the
        # channel, so a caller that dies leaves nothing behind.
        return await self.subscribe(exchange, routing_key)


class KombuAMQPTransport(AMQPTransport):
    """``AMQPTransport`` whose events and remote control use Celery's exchanges."""

    def __init__(self, url: str, settings: Settings) -> None:
        super().__init__(url, settings)
        self.channels = CeleryChannels(AMQPExchanges(self))

    def broadcast(self, channel: str, payload: bytes, routing_key: str = "") -> None:
        if not self.channels.broadcast(channel, payload, routing_key):
            super().broadcast(channel, payload, routing_key)

    def has_subscribers(self, channel: str) -> bool:
        return self.channels.has_subscribers(channel)

    async def subscribe(self, channel: str) -> Subscription:
        sub = await self.channels.subscribe(channel)
        return sub if sub is not None else await super().subscribe(channel)
