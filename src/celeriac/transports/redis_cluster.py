"""The Redis transport on a Redis Cluster (``redis+cluster://``): ``redis.py``'s scripts and
semantics, one hash tag per queue.

A script may touch only keys of one slot. Each queue is therefore its own namespace: the
scripts run with ``{<ns>:<queue>}`` where ``redis.py`` passes ``<ns>`` (``lua/common.lua``
builds every key from it), so a queue's messages, its ready and delayed sets, its idle
set, the consumers' owned sets and wake lists for it, its lease table and its dead
letters all share that queue's slot, and every script stays one atomic call. Queues
spread over the cluster's nodes by their tags.

Why per queue and not per worker: a message must sit where every producer and consumer of
its queue finds it; under a per-worker tag a fetched message would live in another slot
than its queue, so giving it back (a requeue, a lost lease) would be a move across slots
in two calls, with a moment where it is in neither place or in both. Per queue, every
move stays inside one script. What it costs:

- a fetch (or the worker's settle_and_fetch) from several queues is one call per queue, in the
  order given, each asking for what is still wanted: priority orders messages within a
  queue, not across queues (as on RabbitMQ);
- a consumer's lease is kept per queue it consumes (a renewal is one call per queue), and
  a dead consumer's messages are returned by a live consumer of the same queue;
- an idle consumer of several queues blocks on each queue's wake list at once (one
  connection each) and wakes at the first token;
- delivery tags and dead-letter ids are ``<id>@<queue>`` (ids count per queue);
- results are stored through the result backend (other slots), not in settle_and_fetch.
Broadcasts use pub/sub on one node: a Cluster relays PUBLISH to every node. Their channels
are named as on one server (``Endpoint.channel``, database 0).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..backends.redis import FEED_LENGTH
from ..clients.redis.cluster import ClusterConnector
from ..protocol import Delivery
from .base import DeadLetter, Outgoing, Subscription, Transport
from .redis import (
    _BLOCK_GUARD,
    _PURGE_BATCH,
    RedisSubscription,
    RedisTransport,
    _delay_ms,
    _message,
    confirmed,
)

if TYPE_CHECKING:
    import redis.asyncio as aredis
    from redis.asyncio.cluster import RedisCluster as AsyncCluster
    from redis.cluster import RedisCluster

    from ..backends.base import ResultBackend, Stored
    from ..settings import Settings

logger = logging.getLogger("celeriac.transports.redis_cluster")


def _split(tags: Iterable[str]) -> dict[str, list[str]]:
    """Delivery tags (``<id>@<queue>``) -> queue -> ids."""
    out: dict[str, list[str]] = {}
    for tag in tags:
        msg_id, _, queue = str(tag).partition("@")
        if msg_id.isdigit() and queue:
            out.setdefault(queue, []).append(f"{int(msg_id):016d}")
    return out


class RedisClusterTransport(RedisTransport):
    scheme = "redis+cluster"
    fanout = False  # a group's queues live in many slots: no one script copies to all

    async def bind_fanout(self, group: str, queue: str) -> None:
        await Transport.bind_fanout(self, group, queue)

    def __init__(self, url: str, settings: Settings) -> None:
        Transport.__init__(self, url, settings)
        configured = [u.strip() for u in settings.broker_url.split(";") if u.strip()]
        urls = configured if url.strip() in configured else [url]
        self.cluster = ClusterConnector(urls, settings, "broker",
                                        read_timeout=settings.broker_connection_timeout,
                                        options=settings.broker_transport_options)
        self._init_state()
        self._queues: dict[str, None] = {}
        """The queues this consumer has fetched from, in order: its leases are there."""

    def _tag(self, queue: str) -> str:
        return self.cluster.tag(queue)

    # -- producer -----------------------------------------------------------------------
    def publish_many(self, items: Sequence[Outgoing]) -> None:
        by_queue: dict[str, list[Any]] = {}
        for item in items:
            self.check_size(item.message)
        for item in items:
            m = item.message
            by_queue.setdefault(item.queue, []).extend(
                [item.queue, 9 - min(max(m.priority, 0), 9), _delay_ms(item.delay),
                 *self._stored(m)])
        for queue, args in by_queue.items():
            self.cluster.run("publish", self._tag(queue), [len(args) // 5, *args],
                             durable=True)

    # -- consumer -----------------------------------------------------------------------
    async def connect(self, consumer_id: str) -> None:
        if consumer_id != self.consumer_id:
            self._held.clear()
            self._unacked.clear()
            self._queues.clear()
        await Transport.connect(self, consumer_id)
        for queue in self._queues:  # a reconnect: renew where we hold leases
            await self._heartbeat(queue)

    async def _adopt(self, queues: Sequence[str]) -> None:
        """A queue seen for the first time: take up the lease there (which returns dead
        consumers' messages), and give back what an earlier consumer of our id left."""
        for queue in queues:
            if queue not in self._queues:
                self._queues[queue] = None
                await self._heartbeat(queue)
                await self._reconcile_queue(self._me(), queue, counted=True)

    def _deliveries(self, reply: list[Any]) -> list[Delivery]:
        deliveries = [
            Delivery(_message(reply[i + 3], reply[i + 4]), reply[i + 1].decode(),
                     f"{int(reply[i])}@{reply[i + 1].decode()}", int(reply[i + 2]))
            for i in range(1, len(reply), 5)
        ]
        self._held.update(d.tag for d in deliveries)
        return deliveries

    async def fetch(self, queues: Sequence[str], limit: int, timeout: float) -> list[Delivery]:
        names = list(dict.fromkeys(queues))
        if limit <= 0 or not names:
            return []
        deadline = time.monotonic() + timeout
        while True:
            deliveries = await self.settle_and_fetch([], [], None, names, limit)
            if deliveries:
                return deliveries
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            if self._next_due == 0:
                continue
            await self.wait_ready(names, limit, remaining)

    def results_namespace(self, backend: ResultBackend) -> str | None:
        return None  # results live in other slots: the worker stores them itself

    async def settle_and_fetch(self, acks: Sequence[Delivery], results: Sequence[Stored],
                       results_namespace: str | None, queues: Sequence[str], limit: int
                       ) -> list[Delivery]:
        """Ack ``acks``, then fetch up to ``limit``: one settle_and_fetch.lua call per
        queue. A queue that comes back short registers us as idle there (``wait_ready``
        sleeps next)."""
        if results:
            raise ValueError("RedisClusterTransport cannot store results itself")
        me = self._me()
        names = list(dict.fromkeys(queues)) if limit > 0 else []
        await self._adopt(names)
        if names and self._suspect:
            await self._reconcile(me, counted=False)
        tags = [d.tag for d in acks]
        batch = list(dict.fromkeys([*tags, *self._unacked])) if self._unacked else tags
        by_queue = _split(batch)
        out: list[Delivery] = []
        dues: list[int] = []
        for queue in [*names, *(q for q in by_queue if q not in names)]:
            want = limit - len(out) if queue in names else 0
            ids = by_queue.get(queue, [])
            if want <= 0 and not ids:
                continue
            args: list[Any] = [me, self._lease_ms(), max(want, 0), "", 0, len(ids),
                               FEED_LENGTH, *ids]
            if want > 0:
                args.append(queue)
            failures = self.cluster.async_failures
            try:
                reply = await self.cluster.arun("settle_and_fetch", self._tag(queue), args)
            except BaseException:
                if names:
                    self._suspect = True  # its reply may be lost with messages in it
                raise
            finally:
                if names and self.cluster.async_failures != failures:
                    self._suspect = True
            self._held.difference_update(f"{int(i)}@{queue}" for i in ids)
            if want > 0:
                dues.append(int(reply[0]))
            out += self._deliveries(reply)
        self._unacked.clear()
        if names:
            soon = [d for d in dues if d >= 0]
            self._next_due = min(soon) if soon else -1
        return out

    async def wait_ready(self, queues: Sequence[str], limit: int, timeout: float
                         ) -> list[Delivery] | None:
        due = self._next_due
        if due == 0:
            return None
        wait = timeout if due < 0 else min(timeout, due / 1000)
        await self._sleep_on(list(dict.fromkeys(queues)), max(math.ceil(wait * 1000), 1) / 1000)
        return None

    async def _sleep_on(self, queues: list[str], seconds: float) -> None:
        """Until a token comes on the wake list of any of ``queues``, or ``seconds`` pass:
        one BLPOP per queue (their lists are in different slots), the first ends all."""
        me = self._me()

        def blpop(queue: str) -> Any:
            async def op(client: AsyncCluster, ns: str) -> Any:
                async with asyncio.timeout(seconds + _BLOCK_GUARD):
                    return await client.blpop([f"{self._tag(queue)}:wake:{me}"], seconds)
            return op

        waits = [asyncio.ensure_future(self.cluster.acall(blpop(q))) for q in queues]
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()  # a token it took only meant "look again": the fetch looks anyway
            await asyncio.gather(*waits, return_exceptions=True)
        for w in done:
            w.result()

    async def _reconcile(self, me: str, *, counted: bool) -> None:
        for queue in list(self._queues):
            await self._reconcile_queue(me, queue, counted=counted)
        self._suspect = False

    async def _reconcile_queue(self, me: str, queue: str, *, counted: bool) -> None:
        async def owned(client: AsyncCluster, ns: str) -> set[str]:
            members = await client.smembers(f"{self._tag(queue)}:owned:{me}")
            return {f"{int(m)}@{queue}" for m in members}

        lost = await self.cluster.acall(owned) - self._held
        if lost:
            moved = await self.cluster.arun(
                "requeue", self._tag(queue), [me, int(not counted), 0, *_split(lost)[queue]])
            logger.warning("gave back %d message(s) of queue %r owned by consumer %r that it "
                           "never received", moved, queue, me)

    # -- where scripts run: the queue's slot --------------------------------------------
    def _by_place(self, tags: Iterable[str]) -> dict[str, list[str]]:
        return _split(tags)

    def _places(self) -> list[str]:
        return list(self._queues)

    def _idle_queues(self, place: str) -> list[str]:
        return [place]  # a place is a queue, and its idle set is in that queue's slot

    async def _arun_at(self, place: str, script: str, args: list[Any]) -> Any:
        return await self.cluster.arun(script, self._tag(place), args)

    async def _heartbeat(self, queue: str) -> int:
        return int(await self.cluster.arun("heartbeat", self._tag(queue),
                                           [self._me(), self._lease_ms()]))

    async def release(self) -> None:
        await self.cluster.aclose()

    # -- administration -----------------------------------------------------------------
    def ping(self) -> None:
        self.cluster.call(lambda client, ns: client.ping())

    def queue_length(self, queue: str) -> int:
        key = f"{self._tag(queue)}:q:{queue}"
        return int(self.cluster.call(lambda client, ns: client.zcard(key)))

    def purge(self, queue: str) -> int:
        return int(self.cluster.run("purge", self._tag(queue), [queue]))

    def _dead_queues(self) -> list[str]:
        """Queues with a dead-letter set, from a SCAN of every primary."""
        def scan(client: RedisCluster, ns: str) -> list[str]:
            prefix = self._tag("")[:-1]  # "{<ns>:"
            pattern = "".join(f"\\{c}" if c in "*?[]\\" else c for c in prefix) + "*}:dead"
            keys = client.scan_iter(match=pattern, count=1000,
                                    target_nodes=client.PRIMARIES)
            return sorted({k.decode()[len(prefix):-len("}:dead")] for k in keys})

        return self.cluster.call(scan)

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        if limit <= 0:
            return []
        out: list[DeadLetter] = []
        for queue in self._dead_queues():
            r = self.cluster.run("dead_letters", self._tag(queue), [limit])
            out += [DeadLetter(f"{int(r[i])}@{queue}", r[i + 1].decode(),
                               r[i + 2].decode("utf-8", "replace"), _message(r[i + 5], r[i + 6]),
                               int(r[i + 3] or 0), float(r[i + 4]))
                    for i in range(0, len(r), 7)]
        return sorted(out, key=lambda d: d.dead_at)[:limit]

    def requeue_dead(self, ids: Sequence[int | str]) -> int:
        return sum(int(self.cluster.run("requeue_dead", self._tag(queue), keys))
                   for queue, keys in _split(map(str, ids)).items())

    def purge_dead(self, ids: Sequence[int | str] | None = None) -> int:
        if ids is not None:
            return sum(int(self.cluster.run("purge_dead", self._tag(queue), ["ids", *keys]))
                       for queue, keys in _split(map(str, ids)).items())
        total = 0
        for queue in self._dead_queues():
            for _ in range(1_000_000):  # in batches, so one call never holds a node long
                n = int(self.cluster.run("purge_dead", self._tag(queue),
                                         ["oldest", _PURGE_BATCH]))
                total += n
                if n < _PURGE_BATCH:
                    break
        return total

    # -- broadcast ----------------------------------------------------------------------
    # ``Endpoint.channel`` names them as on one server (database 0: a Cluster has no
    # other), so namespaces sharing a Cluster stay apart.
    def broadcast(self, channel: str, payload: bytes, routing_key: str = "") -> None:
        name = self.cluster.endpoint.channel(channel)
        self.cluster.call(lambda client, ns: client.publish(name, payload))

    def has_subscribers(self, channel: str) -> bool:
        return True  # PUBSUB NUMSUB counts one node's subscribers only: cannot tell

    def control_listeners(self) -> int | None:
        return None  # as has_subscribers: mingle waits its timeout

    async def subscribe(self, channel: str) -> Subscription:
        client = await self.cluster.node_client()
        try:
            pubsub = await confirmed(client, self.cluster.endpoint.channel(channel),
                                     self.settings.broker_connection_timeout)
        except BaseException:
            await client.aclose()
            raise
        return _ClusterSubscription(pubsub, self.cluster.endpoint.safe, client)

    def close(self) -> None:
        self.cluster.close()


class _ClusterSubscription(RedisSubscription):
    def __init__(self, pubsub: aredis.client.PubSub, where: str, client: aredis.Redis) -> None:
        super().__init__(pubsub, where)
        self.client = client

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            await self.client.aclose()
