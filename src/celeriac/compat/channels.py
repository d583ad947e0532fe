"""celeriac's broadcast channels on Celery's exchanges, for the compatibility layout
(``?layout=kombu`` on Redis and RabbitMQ).

Events and remote control reach the broker only through three methods of a transport:
``broadcast(channel, payload, routing_key)``, ``has_subscribers(channel)`` and
``subscribe(channel)``, on three kinds of channel: ``celeriac.events``,
``celeriac.control`` and a call's private reply channel (``celeriac.reply.<key>``). A
kombu-layout transport hands these to ``CeleryChannels``, which sends them where
Celery's own clients and workers look:

==================== ============================================ =====================
channel              Celery's exchange                            payload
==================== ============================================ =====================
``celeriac.events``  ``celeryev`` (topic; ``#`` to receive)       ``events.py``
``celeriac.control`` ``celery.pidbox`` (fanout)                   the command, as is
reply ``<key>``      ``reply.celery.pidbox`` (direct) by ``<key>`` ``{hostname: reply}``
                     to the queue ``<key>.reply.celery.pidbox``    + ``ticket`` header
==================== ============================================ =====================

So the dispatcher, the receiver, ``app.control`` and the worker's ``Control`` step work
unchanged on this layout, and speak to Celery's side as well as to ours. Any other
channel is the transport's own (``None`` / ``False`` below). How a broker carries a
kombu exchange is the ``KombuExchanges`` of each: ``redis_pubsub.py`` (Redis: kombu's
PUBLISH/PSUBSCRIBE fanout and its binding sets), ``amqp_broker.py`` (RabbitMQ: the
exchanges themselves, declared with Celery's arguments).
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Mapping
from typing import Any

from ..transports.base import CONTROL_CHANNEL, EVENTS_CHANNEL, PRIVATE_PREFIX, Subscription
from . import events as celery_wire
from . import pidbox
from .kombu_wire import Exchange

logger = logging.getLogger("celeriac.transports.celery_channels")


class KombuExchanges(abc.ABC):
    """kombu's exchanges on one broker, as Celery's clients declare and use them."""

    @abc.abstractmethod
    def publish(self, exchange: Exchange, routing_key: str, body: bytes,
                headers: Mapping[str, Any]) -> None:
        """Send the JSON ``body`` through ``exchange`` with ``routing_key``, transient;
        dropped where nothing is bound. Blocking, from any thread (as ``broadcast``)."""

    def listened(self, exchange: Exchange) -> bool:
        """False only when the broker can tell that nobody receives from ``exchange``."""
        return True

    def listeners(self, exchange: Exchange) -> int | None:
        """How many receive from ``exchange`` now, where the broker can tell exactly."""
        return None

    @abc.abstractmethod
    async def subscribe(self, exchange: Exchange, binding_key: str) -> Subscription:
        """The bodies published from now on through the fanout or topic ``exchange`` with
        a routing key that ``binding_key`` matches (``""``: a fanout's only key)."""

    @abc.abstractmethod
    async def consume(self, exchange: Exchange, routing_key: str, queue: str
                      ) -> Subscription:
        """The bodies routed by ``routing_key`` through the direct ``exchange``, to a queue
        of this caller's named ``queue`` that goes when the subscription closes."""


class Mapped(Subscription):
    """A subscription whose payloads pass through ``convert`` first."""

    def __init__(self, inner: Subscription, convert: Callable[[bytes], bytes]) -> None:
        self.inner = inner
        self.convert = convert

    async def get(self, timeout: float) -> bytes | None:
        payload = await self.inner.get(timeout)
        return None if payload is None else self.convert(payload)

    async def close(self) -> None:
        await self.inner.close()


class CeleryChannels:
    """Routes a kombu-layout transport's broadcast channels to Celery's exchanges (see
    the module doc). Each method answers None / False for a channel it does not route:
    the transport then uses its own."""

    def __init__(self, exchanges: KombuExchanges) -> None:
        self.exchanges = exchanges

    def broadcast(self, channel: str, payload: bytes, routing_key: str = "") -> bool:
        """Send ``payload``; for a reply channel ``routing_key`` is the call's ticket
        (kombu's ``ticket`` header). False: not a channel of ours."""
        if channel == EVENTS_CHANNEL:
            self.exchanges.publish(celery_wire.EXCHANGE, routing_key,
                                   celery_wire.outgoing(payload, routing_key), {})
        elif channel == CONTROL_CHANNEL:
            # A fanout's routing key is "" as kombu's mailbox sends it: on Redis it is
            # part of the channel name Celery's workers subscribe to.
            self.exchanges.publish(pidbox.EXCHANGE, "", payload, pidbox.command_headers())
        elif channel.startswith(PRIVATE_PREFIX):
            key = channel[len(PRIVATE_PREFIX):]
            self.exchanges.publish(pidbox.REPLY_EXCHANGE, key, payload,
                                   pidbox.reply_headers(routing_key or key))
        else:
            return False
        return True

    def has_subscribers(self, channel: str) -> bool:
        if channel == EVENTS_CHANNEL:
            return self.exchanges.listened(celery_wire.EXCHANGE)
        return True

    def control_listeners(self) -> int | None:
        """How many workers (celeriac's and Celery's) receive commands, where the broker
        can tell; mingle waits for that many replies."""
        return self.exchanges.listeners(pidbox.EXCHANGE)

    async def subscribe(self, channel: str) -> Subscription | None:
        if channel == EVENTS_CHANNEL:
            sub = await self.exchanges.subscribe(celery_wire.EXCHANGE, celery_wire.BINDING)
            return Mapped(sub, celery_wire.incoming)
        if channel == CONTROL_CHANNEL:
            return await self.exchanges.subscribe(pidbox.EXCHANGE, "")
        if channel.startswith(PRIVATE_PREFIX):
            key = channel[len(PRIVATE_PREFIX):]
            return await self.exchanges.consume(pidbox.REPLY_EXCHANGE, key,
                                                pidbox.reply_queue(key))
        return None
