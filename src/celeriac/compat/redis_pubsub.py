"""kombu's exchanges on Redis, as Celery's clients use them: the broker side of Celery's
events and remote-control mailbox for the kombu-layout transport (``redis_broker.py``;
what goes through them is in ``channels.py``).

kombu's Redis transport has no exchanges; it emulates two kinds (``kombu/transport/
redis.py``, defaults of kombu 4 and later):

- **fanout / topic**: a PUBLISH of the message envelope (``kombu_wire.
  broadcast_envelope``) on ``/<db>.<exchange>/<routing key>``, or ``/<db>.<exchange>``
  without a key (``fanout_prefix`` makes the ``/<db>.`` prefix, ``fanout_patterns`` the
  key suffix). kombu's consumers PSUBSCRIBE ``/<db>.<exchange>/<binding>`` with ``#``
  turned into ``*``, or the bare name for an empty binding. We SUBSCRIBE where the name
  is exact (Celery's ``celery.pidbox``) and PSUBSCRIBE where it is a pattern
  (``celeryev``), so ``PUBSUB NUMSUB`` counts our workers exactly.
- **direct**: a binding set ``_kombu.binding.<exchange>`` holds ``<routing key>\\x06\\x16
  <pattern>\\x06\\x16<queue>`` members; a publisher LPUSHes the envelope to every queue
  whose member has the routing key (one script here, so a reply is routed by one
  consistent view of the set), and the consumer pops the queue's list. kombu 5.7 also
  records a deadline for the set of an expiring queue in ``_kombu.binding_deadlines``
  and sweeps overdue sets; our reply queue's binding is added the same way, and removed
  with the list when the caller stops listening.

Nothing here is stored for long: pub/sub keeps nothing, a reply list expires
(``pidbox.REPLY_EXPIRES_MS``) if its caller has gone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from ..clients.redis.scripts import script_source
from ..errors import ConfigurationError, OperationalError
from ..transports.base import Subscription
from ..transports.redis import RedisSubscription, confirmed
from . import kombu_wire as kw
from . import pidbox
from .channels import KombuExchanges
from .kombu_wire import Exchange

if TYPE_CHECKING:
    import redis.asyncio as aredis

    from ..clients.redis import Connector

logger = logging.getLogger("celeriac.transports.kombu_pubsub")

ROUTE = script_source("kombu_route", prelude=None)

BIND = script_source("kombu_bind", prelude=None)


KOMBU_DEFAULTS = {"fanout_prefix": True, "fanout_patterns": True}
"""kombu's Redis transport options that move where Celery's clients publish and listen;
only their defaults (kombu 4 and later) are spoken here."""


def check_options(options: Mapping[str, Any]) -> None:
    """Refuse kombu transport options that would put Celery's fleet on other channels
    or keys than ours (silently deaf to each other otherwise)."""
    for name, default in KOMBU_DEFAULTS.items():
        if name in options and options[name] != default:
            raise ConfigurationError(
                f"broker_transport_options[{name!r}]={options[name]!r}: the kombu layout "
                f"speaks kombu's default ({default!r}) only")


def database(url: str) -> int:
    """The Redis database a URL names, as redis-py reads it (``/<db>``, or ``?db=``)."""
    parts = urlsplit(url)
    path = parts.path.strip("/")
    query = dict(parse_qsl(parts.query))
    text = query.get("db") or path or "0"
    return int(text) if text.isdigit() else 0


class RedisExchanges(KombuExchanges):
    """kombu's fanout and direct exchanges on the Redis of ``conn`` (database ``db``),
    under ``keys``' global key prefix (which kombu puts on channel names too)."""

    def __init__(self, conn: Connector, db: int, keys: kw.Keys | None = None) -> None:
        self.conn = conn
        self.keys = keys or kw.Keys()
        self.prefix = f"{self.keys.prefix}/{db}."
        self._pubsub_denied = False

    def topic(self, exchange: Exchange, routing_key: str) -> str:
        """kombu's ``_get_publish_topic``."""
        if routing_key:
            return f"{self.prefix}{exchange.name}/{routing_key}"
        return f"{self.prefix}{exchange.name}"

    def publish(self, exchange: Exchange, routing_key: str, body: bytes,
                headers: Mapping[str, Any]) -> None:
        raw = kw.broadcast_envelope(body, headers, exchange.name, routing_key)
        if exchange.type == "direct":
            args: list[str | bytes | int] = [self.keys.binding(exchange.name), kw.SEP,
                                             routing_key, raw, pidbox.REPLY_EXPIRES_MS,
                                             self.keys.prefix]
            self.conn.call(lambda client, ns: client.register_script(ROUTE)(
                keys=[], args=args, client=client))
            return
        topic = self.topic(exchange, routing_key)
        self.conn.command(lambda ns: ("PUBLISH", topic, raw))

    def listened(self, exchange: Exchange) -> bool:
        # kombu's receivers (and ours) PSUBSCRIBE, and PUBSUB counts patterns only
        # server-wide: any pattern at all may be one of them.
        return self._pubsub("NUMPAT") != 0

    def listeners(self, exchange: Exchange) -> int | None:
        """Exact subscribers of ``exchange``'s bare topic (our workers); None while any
        pattern subscriber (a kombu consumer, maybe Celery's worker) may listen too."""
        numpat = self._pubsub("NUMPAT")
        if numpat is None or numpat:
            return None
        return self._pubsub("NUMSUB", self.topic(exchange, ""))

    def _pubsub(self, what: str, *channels: str) -> int | None:
        if self._pubsub_denied:
            return None
        try:
            reply = self.conn.command(lambda ns: ("PUBSUB", what, *channels))
        except OperationalError as exc:
            text = str(exc)
            if "NOPERM" not in text and "unknown" not in text.lower():
                raise  # unreachable, auth...: the sender backs off as for PUBLISH
            logger.info("cannot tell who subscribed (%s); broadcasting anyway", exc)
            self._pubsub_denied = True
            return None
        return int(reply[1] if channels else reply)

    async def subscribe(self, exchange: Exchange, binding_key: str) -> Subscription:
        pattern = binding_key.replace("#", "*") if binding_key else ""
        name = self.topic(exchange, pattern)

        async def open_(client: aredis.Redis, ns: str) -> Subscription:
            pubsub = await confirmed(client, name, self.conn.settings.broker_connection_timeout,
                                     pattern=bool(pattern))
            return _Fanout(pubsub, name)

        return await self.conn.acall(open_)

    async def consume(self, exchange: Exchange, routing_key: str, queue: str
                      ) -> Subscription:
        table = self.keys.binding(exchange.name)
        member = kw.SEP.join([routing_key, "", queue])
        await self.conn.acall(lambda client, ns: client.register_script(BIND)(
            keys=[table, self.keys.binding_deadlines],
            args=[member, exchange.name, pidbox.REPLY_BINDING_TTL_MS], client=client))
        return _ReplyList(self.conn, table, member, self.keys.queue(queue))


class _Fanout(RedisSubscription):
    """A pub/sub subscription yielding the bodies of kombu envelopes."""

    def body(self, data: bytes) -> bytes | None:
        body = kw.broadcast_body(data)
        if body is None:
            logger.debug("not a kombu message on %s: %r", self.where, data[:200])
        return body


class _ReplyList(Subscription):
    """A caller's reply queue: kombu's list, popped with BRPOP (replies wait in it, so
    nothing is lost between two calls of ``get``); unbound and deleted on close."""

    def __init__(self, conn: Connector, table: str, member: str, queue: str) -> None:
        self.conn = conn
        self.table = table
        self.member = member
        self.queue = queue

    async def get(self, timeout: float) -> bytes | None:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            raw = await self.conn.acall(partial(self._pop, remaining))
            if raw is not None:
                body = kw.broadcast_body(raw)
                if body is not None:
                    return body
                logger.debug("not a kombu message in %s: %r", self.queue, raw[:200])
                continue
            if remaining < 0.01:
                return None

    async def _pop(self, remaining: float, client: aredis.Redis, ns: str) -> bytes | None:
        if remaining < 0.01:  # BRPOP's 0 would block for good
            raw: Any = await client.rpop(self.queue)
            return bytes(raw) if raw is not None else None
        popped: Any = await client.brpop(
            [self.queue], timeout=round(min(remaining, 1.0), 3))
        return bytes(popped[1]) if popped else None

    async def close(self) -> None:
        async def drop(client: aredis.Redis, ns: str) -> None:
            async with client.pipeline(transaction=True) as pipe:
                pipe.srem(self.table, self.member)
                pipe.delete(self.queue)
                await pipe.execute()

        try:
            await self.conn.acall(drop)
        except Exception as exc:  # the list expires by itself; the binding is swept
            logger.debug("removing reply queue %s: %s", self.queue, exc)
