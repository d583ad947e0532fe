"""The Redis broker in kombu's layout (``redis://host:6379/0?layout=kombu``): celeriac
workers and producers share queues with Celery's.

The layout, the envelope and the scripts are in ``kombu_wire.py``. How celeriac's
transport contract maps onto it:

- **Publish** LPUSHes kombu's envelope to the queue's list for its priority step and adds
  Celery's binding (``_kombu.binding.<queue>``), once per queue and process. A task with
  ``countdown``/``eta`` is published at once with its ``eta`` header, as Celery does
  (kombu's Redis has no delay store; a Celery worker holds it in memory, a celeriac worker
  parks it, below).
- **Fetch** pops, in kombu's order (every queue's step-0 list first: 0 is the highest
  priority here, as in kombu), and records each message in ``unacked``/``unacked_index``
  in the same script. An idle worker polls (every 5 ms, doubling to 100 ms): a BRPOP whose
  reply is lost when the connection drops would lose the message it popped.
- **Ack** deletes the message from ``unacked`` and ``unacked_index``.
- **Leases are kombu's visibility timeout.** A message stays in ``unacked`` while a
  worker holds it; any kombu or celeriac worker restores it to its queue
  ``visibility_timeout`` seconds (transport option or URL parameter, kombu's default
  3600) after it was handed out. A live celeriac worker re-stamps what it holds at each
  lease renewal, so its long tasks are never restored under it (a Celery worker's are,
  after the timeout: Celery's own behaviour). A dead worker's messages come back only
  after the timeout, not after ``worker_lease_timeout`` as on celeriac's own layout.
- **Delays of the worker's own** (parking a foreign ``eta`` message, a lost delivery's
  backoff) wait in celeriac's delay store and move to the front of their list when due;
  only celeriac workers move them.
- **Dead letters** are celeriac's (kombu has none), in ``_celeriac.kombu.dead``.
- Broadcasts (events, remote control) go where Celery's go: ``celeryev`` and the
  ``celery.pidbox`` mailbox, by kombu's pub/sub and binding sets
  (``channels.py``, ``redis_pubsub.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson

from ..clients.redis import Connector
from ..errors import ConfigurationError
from ..protocol import Delivery, new_id, utcnow
from ..settings.routing import Routing
from ..transports.base import DeadLetter, Outgoing, Subscription
from ..transports.redis import RedisTransport
from . import kombu_wire as kw
from .channels import CeleryChannels
from .redis_pubsub import RedisExchanges, check_options, database

if TYPE_CHECKING:
    import redis
    import redis.asyncio as aredis

    from ..backends.base import ResultBackend
    from ..settings import Settings

logger = logging.getLogger("celeriac.transports.kombu_redis")

OPTIONS = ("layout", "visibility_timeout", "global_keyprefix")
"""Our URL parameters (the last two also kombu transport options): taken out before the
URL reaches redis-py."""
_POLL_MIN, _POLL_MAX = 0.005, 0.1
_RESTORE_BATCH = 100


@dataclass(frozen=True, slots=True)
class KombuHeld:
    """A fetched message's delivery tag: kombu's tag, its list, and the envelope."""

    tag: str
    key: str
    raw: bytes


def split_options(url: str) -> tuple[str, dict[str, str]]:
    """``url`` without our parameters, and them."""
    parts = urlsplit(url.strip())
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in OPTIONS}
    if any(k == "namespace" for k, _ in query):
        raise ConfigurationError(
            "namespace: the kombu layout has no namespace (kombu's keys are fixed); use a "
            "Redis database of its own (redis://host:6379/<db>?layout=kombu)")
    rest = urlencode([(k, v) for k, v in query if k not in OPTIONS])
    return urlunsplit(parts._replace(query=rest)), ours


class KombuRedisTransport(RedisTransport):
    scheme = "redis"
    fanout = False  # kombu's Redis fanout is pub/sub (lossy): no Broadcast queues here

    async def bind_fanout(self, group: str, queue: str) -> None:
        raise ConfigurationError(
            f"queue {group!r} is a Broadcast (fanout) queue, which kombu's Redis layout "
            "cannot carry: Celery's Broadcast on Redis is pub/sub, lost by every worker "
            "not listening at that moment; beside Celery, use RabbitMQ for Broadcast")

    def __init__(self, url: str, settings: Settings) -> None:
        # Not RedisTransport's: no namespace, and our own URL parameters.
        self.url, self.settings, self.consumer_id = url, settings, None
        configured = [u.strip() for u in settings.broker_url.split(";") if u.strip()]
        urls = configured if url.strip() in configured else [url]
        plain, options = [], {}
        for u in urls:
            stripped, ours = split_options(u)
            plain.append(stripped)
            options.update(ours)
        topts = settings.broker_transport_options or {}
        check_options(topts)
        raw = options.get("visibility_timeout", topts.get("visibility_timeout",
                                                          kw.VISIBILITY_TIMEOUT))
        try:
            self.visibility_timeout = float(raw)
        except (TypeError, ValueError):
            raise ConfigurationError(f"visibility_timeout must be a number of seconds, got "
                                     f"{raw!r}") from None
        if self.visibility_timeout <= 0:
            raise ConfigurationError(f"visibility_timeout must be positive, got {raw!r}")
        prefix = options.get("global_keyprefix", topts.get("global_keyprefix")) or ""
        if not isinstance(prefix, str):
            raise ConfigurationError(f"broker_transport_options['global_keyprefix'] must be "
                                     f"a string, got {prefix!r}")
        self.keys = kw.Keys(prefix)
        self.conn = Connector(plain, settings, "broker",
                              read_timeout=settings.broker_connection_timeout)
        self._pubsub_denied = False
        self._bound: set[str] = set()
        self._topics = {q.name: (q.exchange, q.routing_key)
                        for q in Routing(settings).declared if q.kind == "topic"}
        """Topic queues of task_queues -> (exchange, pattern): bound in kombu's binding
        set where consumed, so a Celery producer's topic lookup finds them (celeriac's
        own producers route by the pattern themselves)."""
        self._topics_bound: set[str] = set()
        self._holding: dict[str, KombuHeld] = {}
        self._poll = _POLL_MIN
        self.channels = CeleryChannels(RedisExchanges(self.conn, database(plain[0]),
                                                      self.keys))

    # -- producer -----------------------------------------------------------------------
    def publish_many(self, items: Sequence[Outgoing]) -> None:
        if not items:
            return
        for item in items:
            self.check_size(item.message)
        pushes: list[tuple[str, bytes]] = []
        parked: list[Any] = []
        for item in items:
            message = item.message
            if item.delay and item.delay > 0 and message.headers.get("eta") is None:
                due = utcnow().timestamp() + item.delay
                message = message.with_headers(eta=_iso(due))
            key = self.keys.list_key(item.queue, message.priority)
            raw = kw.envelope(item.queue, message)
            if item.delay and item.delay > 0 and self.consumer_id is not None:
                # A worker parking a message (a foreign eta, a loss's backoff): in our
                # delay store, not in this process's memory.
                parked += ["", "", key, raw, max(round(item.delay * 1000), 1)]
            else:
                pushes.append((key, raw))
        new = sorted({i.queue for i in items} - self._bound)

        def push(client: redis.Redis, ns: str) -> None:
            pipe = client.pipeline(transaction=False)
            for queue in new:
                pipe.sadd(self.keys.binding(queue), kw.binding_member(queue))
                pipe.sadd(self.keys.binding_permanent(queue), kw.binding_member(queue))
            for key, raw in pushes:
                pipe.lpush(key, raw)
            pipe.execute()

        if pushes or new:
            self.conn.call(push)
        if parked:
            self.conn.call(lambda client, ns: _script(client, kw.MOVE, self._move_args(parked)))
        self._bound.update(new)

    def _move_args(self, groups: list[Any]) -> list[Any]:
        k = self.keys
        return [k.unacked, k.unacked_index, k.delayed, k.delayed_msgs, k.seq, *groups]

    # -- consumer -----------------------------------------------------------------------
    async def connect(self, consumer_id: str) -> None:
        if consumer_id != self.consumer_id:
            self._holding.clear()
        self.consumer_id = consumer_id

    def results_namespace(self, backend: ResultBackend) -> str | None:
        return None  # results are stored by the backend, not in our fetch script

    async def fetch(self, queues: Sequence[str], limit: int, timeout: float) -> list[Delivery]:
        deadline = time.monotonic() + timeout
        while True:
            got = await self._fetch(queues, limit)
            remaining = deadline - time.monotonic()
            if got or remaining <= 0:
                return got
            await asyncio.sleep(min(self._poll, remaining))
            self._poll = min(self._poll * 2, _POLL_MAX)

    async def settle_and_fetch(self, acks: Sequence[Delivery], results: Sequence[Any],
                       results_namespace: str | None, queues: Sequence[str], limit: int
                       ) -> list[Delivery]:
        if results:
            raise ValueError("the kombu layout cannot store results in its fetch")
        if acks:
            await self.ack(acks)
        return await self._fetch(queues, limit) if limit > 0 else []

    async def wait_ready(self, queues: Sequence[str], limit: int, timeout: float
                         ) -> list[Delivery] | None:
        await asyncio.sleep(min(self._poll, max(timeout, 0.0)))
        self._poll = min(self._poll * 2, _POLL_MAX)
        return None

    async def _fetch(self, queues: Sequence[str], limit: int) -> list[Delivery]:
        names = list(dict.fromkeys(queues))
        if limit <= 0 or not names:
            return []
        if self._topics and not self._topics_bound.issuperset(names):
            await self._bind_topics(names)
        k = self.keys
        args: list[Any] = [k.unacked, k.unacked_index, k.delayed, k.delayed_msgs, limit,
                           repr(time.time()), k.seq]
        for key, queue in k.list_keys(names):
            args += [key, queue]
        reply = await self.conn.acall(lambda client, ns: _ascript(client, kw.FETCH, args))
        out = []
        for i in range(0, len(reply), 3):
            key, raw, tag = reply[i].decode(), bytes(reply[i + 1]), reply[i + 2].decode()
            message, env = kw.parse(raw)
            held = KombuHeld(tag, key, raw)
            self._holding[tag] = held
            out.append(Delivery(message, self.keys.queue_of(key), held,
                                kw.delivery_count(env)))
        if out:
            self._poll = _POLL_MIN
        return out

    async def _bind_topics(self, queues: Sequence[str]) -> None:
        # As kombu's queue_bind: the member in the exchange's table, and in its
        # permanent twin, which keeps kombu 5.7's sweep off the table.
        new = [q for q in queues if q in self._topics and q not in self._topics_bound]

        async def bind(client: aredis.Redis, ns: str) -> None:
            async with client.pipeline(transaction=False) as pipe:
                for queue in new:
                    exchange, pattern = self._topics[queue]
                    member = kw.topic_member(queue, pattern)
                    pipe.sadd(self.keys.binding(exchange), member)
                    pipe.sadd(self.keys.binding_permanent(exchange), member)
                await pipe.execute()

        if new:
            await self.conn.acall(bind)
        self._topics_bound.update(queues)

    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        tags = [d.tag.tag for d in deliveries]
        if not tags:
            return

        async def drop(client: aredis.Redis, ns: str) -> None:
            async with client.pipeline(transaction=True) as pipe:
                pipe.zrem(self.keys.unacked_index, *tags)
                pipe.hdel(self.keys.unacked, *tags)
                await pipe.execute()

        await self.conn.acall(drop)
        for tag in tags:
            self._holding.pop(tag, None)

    async def requeue(self, deliveries: Sequence[Delivery], *, redelivered: bool,
                      delay: float = 0.0) -> None:
        groups: list[Any] = []
        # Each goes back to the popping end of its list: the last first, so that they
        # come out again in the order they went in.
        for d in reversed(deliveries):
            held: KombuHeld = d.tag
            groups += [held.tag, "", held.key, kw.redelivered(held.raw, counted=redelivered),
                       max(round(delay * 1000), 0)]
        if groups:
            await self._move([d.tag.tag for d in deliveries], groups)

    async def _move(self, tags: list[str], groups: list[Any]) -> None:
        try:
            await self.conn.acall(lambda client, ns: _ascript(client, kw.MOVE,
                                                             self._move_args(groups)))
        finally:
            for tag in tags:
                self._holding.pop(tag, None)

    async def dead_letter(self, delivery: Delivery, reason: str) -> None:
        held: KombuHeld = delivery.tag
        record = orjson.dumps({"queue": delivery.queue, "reason": reason,
                               "count": delivery.delivery_count, "at": time.time(),
                               "raw": held.raw.decode("utf-8", "replace")})

        async def move(client: aredis.Redis, ns: str) -> None:
            k = self.keys
            seq = int(await client.incr(k.seq))
            async with client.pipeline(transaction=True) as pipe:
                pipe.zrem(k.unacked_index, held.tag)
                pipe.hdel(k.unacked, held.tag)
                pipe.hset(k.dead, str(seq), record)
                pipe.zadd(k.dead_ids, {str(seq): seq})
                await pipe.execute()

        try:
            await self.conn.acall(move)
        finally:
            self._holding.pop(held.tag, None)

    async def renew_lease(self) -> int:
        """Re-stamp what this worker holds (so no one restores it under a live worker),
        then restore messages unacknowledged for longer than the visibility timeout, as
        kombu's ``restore_visible`` does (under kombu's ``unacked_mutex``)."""
        now = time.time()
        held = list(self._holding)
        if held:
            await self.conn.acall(lambda client, ns: client.zadd(
                self.keys.unacked_index, dict.fromkeys(held, now), xx=True))
        return await self.conn.acall(self._restore_visible)

    async def _restore_visible(self, client: aredis.Redis, ns: str) -> int:
        k, token = self.keys, new_id()
        if not await client.set(k.unacked_mutex, token, nx=True, px=kw.MUTEX_EXPIRE_MS):
            return 0  # another worker (kombu's or ours) is restoring
        try:
            ceil = time.time() - self.visibility_timeout
            tags = [_text(t) for t in await client.zrangebyscore(
                k.unacked_index, 0, ceil, start=0, num=_RESTORE_BATCH)]
            if not tags:
                return 0
            values = await client.hmget(k.unacked, tags)
            groups: list[Any] = []
            for tag, value in zip(tags, values, strict=True):
                if value is None:
                    await client.zrem(k.unacked_index, tag)
                    continue
                target = await self._target(client, _raw(value))
                if target is None:
                    continue
                key, raw = target
                groups += [tag, value, key, kw.redelivered(raw, counted=True), 0]
            moved = int(await _ascript(client, kw.MOVE, self._move_args(groups))) \
                if groups else 0
            if moved:
                logger.warning("restored %d message(s) unacknowledged for over %.0f s "
                               "(visibility_timeout) to their queues", moved,
                               self.visibility_timeout)
            return moved
        finally:
            await _ascript(client, kw.UNLOCK, [token], keys=[k.unacked_mutex])

    async def _target(self, client: aredis.Redis, value: bytes) -> tuple[str, bytes] | None:
        """Where kombu's ``_lookup`` sends a restored ``[envelope, exchange, routing
        key]``: the routing key's queue (anonymous exchange, as our fetch records), or
        the queue bound to it (``kw.bound_queue``)."""
        try:
            env, exchange, routing_key = orjson.loads(value)
            raw = orjson.dumps(env)
            priority = int(env["properties"].get("priority") or 0)
        except (orjson.JSONDecodeError, ValueError, KeyError, TypeError, AttributeError):
            logger.error("unacked entry is not [envelope, exchange, routing key]: %r",
                         value[:200])
            return None
        queue = routing_key
        if exchange:
            members = [_text(m).split(kw.SEP)
                       for m in await client.smembers(self.keys.binding(exchange))]
            queue = kw.bound_queue(members, routing_key) or routing_key
        return self.keys.list_key(queue, priority), raw

    async def disconnect(self) -> None:
        try:
            held = list(self._holding.values())
            if held:
                groups: list[Any] = []
                for h in reversed(held):  # the last first, as in requeue
                    groups += [h.tag, "", h.key, h.raw, 0]  # given back, uncounted
                await self._move([h.tag for h in held], groups)
                logger.info("gave back %d message(s) on disconnect", len(held))
        finally:
            self._holding.clear()
            await self.release()

    # -- broadcast: Celery's events and mailbox ------------------------------------------
    def broadcast(self, channel: str, payload: bytes, routing_key: str = "") -> None:
        if not self.channels.broadcast(channel, payload, routing_key):
            super().broadcast(channel, payload, routing_key)

    def has_subscribers(self, channel: str) -> bool:
        return self.channels.has_subscribers(channel)

    def control_listeners(self) -> int | None:
        return self.channels.control_listeners()

    async def subscribe(self, channel: str) -> Subscription:
        sub = await self.channels.subscribe(channel)
        return sub if sub is not None else await super().subscribe(channel)

    # -- administration -----------------------------------------------------------------
    def queue_length(self, queue: str) -> int:
        def count(client: redis.Redis, ns: str) -> int:
            pipe = client.pipeline(transaction=False)
            for key, _ in self.keys.list_keys([queue]):
                pipe.llen(key)
            return sum(int(n) for n in pipe.execute())

        return self.conn.call(count)

    def purge(self, queue: str) -> int:
        def drop(client: redis.Redis, ns: str) -> int:
            keys = [key for key, _ in self.keys.list_keys([queue])]
            pipe = client.pipeline(transaction=True)
            for key in keys:
                pipe.llen(key)
            pipe.delete(*keys)
            return sum(int(n) for n in pipe.execute()[:-1])

        return self.conn.call(drop)

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        return self.conn.call(lambda client, ns: kw.dead_letters(client, self.keys, limit)) \
            if limit > 0 else []

    def requeue_dead(self, ids: Sequence[int | str]) -> int:
        return self.conn.call(lambda client, ns: kw.requeue_dead(client, self.keys, ids))

    def purge_dead(self, ids: Sequence[int | str] | None = None) -> int:
        return self.conn.call(lambda client, ns: kw.purge_dead(client, self.keys, ids))


def _raw(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).isoformat()


def _script(client: redis.Redis, source: str, args: Sequence[Any],
            keys: Sequence[str] = ()) -> Any:
    return client.register_script(source)(keys=list(keys), args=list(args), client=client)


async def _ascript(client: aredis.Redis, source: str, args: Sequence[Any],
                   keys: Sequence[str] = ()) -> Any:
    return await client.register_script(source)(keys=list(keys), args=list(args),
                                                client=client)
