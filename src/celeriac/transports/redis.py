"""The Redis broker: Lua scripts over redis-py (hiredis), sync for producers and
administration, ``redis.asyncio`` for the worker.

The key layout is in the header of ``lua/common.lua``, which heads every script. In short:
a message is one string (the compact envelope: headers at their defaults left out, see
``protocol.pack``); ready ids sit in one sorted set per queue (priority, then FIFO);
delayed ids in one sorted set by due time, promoted by whichever fetch finds them due;
fetched ids in the fetching consumer's ``owned`` set. Ownership is the lease: there is no
visibility timeout, a consumer's lease renewal renews its entry in the ``consumers``
sorted set, and any renewal returns every message of each expired consumer in one pass.

Upgrading from the layout of a hash per message: the scripts read both forms, so queues
on a live Redis carry over. Workers of the previous version read only hashes: while any
still consume, publish with ``broker_transport_options={"compact_messages": False}``.

One round trip each: ``publish_many``, a ``fetch`` of up to ``limit`` messages across
several queues, an ``ack`` of a batch, a lease renewal. An idle fetch does not poll: the
fetch script registers the consumer as idle on its queues, and the consumer BLPOPs its
own wake list until the next delayed message is due; whatever makes a message ready in
one of those queues pushes it a token. The worker's sleeper (``wait_ready``) writes the
next fetch behind its BLPOP on a connection of its own, so a wake-up and its messages
come back in one round trip. Broadcasts are Redis pub/sub, on channels named
by ``Endpoint.channel``: ``<namespace>:bc:<db>:<channel>``, so that apps on other
databases of the same server (pub/sub is server-wide) neither hear nor command ours.

Behind Redis Sentinel (``redis+sentinel://``, ``clients/redis/topology.py``) nothing here
changes: the connector finds the master and follows a failover. On a Redis Cluster
(``redis+cluster://``) ``redis_cluster.py`` runs the same scripts once per queue.

Needs Redis 6.2 or later (ZPOPMIN with a count, fractional BLPOP timeouts, exclusive
XRANGE for the result backend).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import redis

from ..backends.redis import FEED_LENGTH, RedisBackend, encode_value, expiry_ms
from ..clients.redis import Connector
from ..clients.redis.scripts import script_sha, script_source
from ..errors import DecodeError, OperationalError
from ..protocol import DECODE_ERROR_HEADER, Delivery, Message
from .base import CONTROL_CHANNEL, DeadLetter, Outgoing, Subscription, Transport

if TYPE_CHECKING:
    import redis.asyncio as aredis

    from ..backends.base import ResultBackend, Stored
    from ..clients.redis.lanes import AsyncLane
    from ..settings import Settings

logger = logging.getLogger("celeriac.transports.redis")

# How much longer than its own timeout a blocking call may take before we presume the
# connection dead (the server answers a BLPOP timeout on time; this is for the network).
_BLOCK_GUARD = 1.0
_PURGE_BATCH = 1000


class RedisTransport(Transport):
    scheme = "redis"
    fanout = True

    _sleeper_lane: tuple[int, asyncio.AbstractEventLoop, AsyncLane] | None = None
    """The sleeper's own connection (``wait_ready``): its BLPOP blocks it. A class
    default, so a subclass that never sleeps here (the kombu layout's) has none to close."""

    def __init__(self, url: str, settings: Settings) -> None:
        super().__init__(url, settings)
        configured = [u.strip() for u in settings.broker_url.split(";") if u.strip()]
        urls = configured if url.strip() in configured else [url]
        self.conn = Connector(urls, settings, "broker",
                              read_timeout=settings.broker_connection_timeout,
                              options=settings.broker_transport_options)
        self._init_state()

    def _init_state(self) -> None:
        self._held: set[str] = set()
        """Tags fetched and not yet settled: what this consumer knows it owns."""
        self._unacked: set[str] = set()
        """Acks that did not reach Redis; sent again with the next ack or lease renewal, so a
        finished task is not run again when the connection comes back."""
        self._pubsub_denied = False  # PUBSUB refused (ACL): has_subscribers says yes
        self._suspect = False
        """A fetch's reply may have been lost: Redis may hold messages for us we never saw."""
        self._next_due = -1
        """From the last turn that fetched: ms until a delayed message is due (-1: none)."""
        self._idle_on: set[str] = set()
        """Queues whose idle set a fetch of ours may have joined: a disconnect leaves them,
        so that no publish wakes a consumer that is gone in place of one that is asleep."""
        self._fanout: dict[str, str] = {}
        """This consumer's fanout queues -> their groups, bound while its lease lasts."""
        options = self.settings.broker_transport_options or {}
        compact = options.get("compact_messages", True)
        self._compact = str(compact).strip().lower() not in ("false", "0", "no", "off")
        """Publish the compact form (``protocol.pack``, one string per message); False:
        the full envelope in the earlier layout's hash, while workers of the previous
        version, which read only that, still consume (an upgrade)."""

    def _stored(self, m: Message) -> tuple[bytes, bytes]:
        return m.packed() if self._compact else (m.envelope(), m.body)

    # -- producer -----------------------------------------------------------------------
    def publish_many(self, items: Sequence[Outgoing]) -> None:
        if not items:
            return
        fanout = False
        for item in items:  # one pass, no generator: this runs for every delay()
            self.check_size(item.message)
            fanout = fanout or item.fanout
        if fanout:
            self._publish_fanout([i for i in items if i.fanout])
            items = [i for i in items if not i.fanout]
            if not items:
                return
        args: list[Any] = [len(items)]
        fair = self.settings.broker_fair_queues
        for item in items:
            m = item.message
            step: int | str = 9 - min(max(m.priority, 0), 9)
            if fair and item.queue in fair:
                # publish.lua tags it by its fair key (producer/flow.py's header).
                step = f"f{step}:{m.headers.get('celeriac_fair') or ''}"
            args += [item.queue, step, _delay_ms(item.delay), *self._stored(m)]
        self.conn.run("publish", args, durable=True)

    def _publish_fanout(self, items: Sequence[Outgoing]) -> None:
        # One script per message: each copies it into every queue bound to its group.
        for item in items:
            m = item.message
            self.conn.run("fanout_publish", [item.queue, 9 - min(max(m.priority, 0), 9),
                                             *self._stored(m)], durable=True)

    # -- fanout groups: a binding lapses with its consumer's lease, so copies stop going
    # to a dead worker's queue; what was copied before waits there for a worker of the
    # same hostname (fanout_queue) at least once.
    async def bind_fanout(self, group: str, queue: str) -> None:
        self._fanout[queue] = group
        await self._bind_fanout(self._lease_ms() * 3)

    async def _bind_fanout(self, ttl_ms: int) -> None:
        if self._fanout:
            pairs = [x for queue, group in self._fanout.items() for x in (group, queue)]
            await self.conn.arun("fanout_bind", [ttl_ms, *pairs])

    # -- consumer -----------------------------------------------------------------------
    def _me(self) -> str:
        if self.consumer_id is None:
            raise RuntimeError("RedisTransport: connect() before consuming")
        return self.consumer_id

    def _lease_ms(self) -> int:
        return math.ceil(self.settings.worker_lease_timeout * 1000)

    async def connect(self, consumer_id: str) -> None:
        if consumer_id != self.consumer_id:
            self._held.clear()
            self._unacked.clear()
        await super().connect(consumer_id)
        await self.renew_lease()
        # Messages owned under this id that we do not hold belong to an earlier consumer
        # of the same id that died; as ours they would never be released: they go back,
        # counted, as if its lease had run out.
        await self._reconcile(consumer_id, counted=True)

    async def fetch(self, queues: Sequence[str], limit: int, timeout: float) -> list[Delivery]:
        me = self._me()
        names = list(dict.fromkeys(queues))  # a queue named twice would be popped twice
        if limit <= 0 or not names:
            return []
        if self._suspect:
            await self._reconcile(me, counted=False)
        self._idle_on.update(names)
        deadline = time.monotonic() + timeout
        while True:
            failures = self.conn.async_failures
            try:
                reply = await self.conn.arun(
                    "fetch", [me, self._lease_ms(), limit, int(timeout > 0), *names])
            finally:
                if self.conn.async_failures != failures:
                    self._suspect = True
            wait_ms = int(reply[0])
            deliveries = self._deliveries(reply)
            if deliveries:
                return deliveries
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            if wait_ms == 0:
                continue  # more delayed messages are due than one fetch promotes
            wait = remaining if wait_ms < 0 else min(remaining, wait_ms / 1000)
            # Whole milliseconds, rounded up: Redis truncates, and a wait that ended a
            # hair early would cost another round of fetch and BLPOP.
            await self._sleep(me, max(math.ceil(wait * 1000), 1) / 1000)

    def _deliveries(self, reply: list[Any]) -> list[Delivery]:
        """The messages of a fetch reply (``fetch_ready`` in common.lua), now held."""
        deliveries = [
            Delivery(_message(reply[i + 3], reply[i + 4]), reply[i + 1].decode(),
                     reply[i].decode(), int(reply[i + 2]))
            for i in range(1, len(reply), 5)
        ]
        self._held.update(d.tag for d in deliveries)
        return deliveries

    def results_namespace(self, backend: ResultBackend) -> str | None:
        """The namespace of ``backend`` when it keeps its results on this broker's server
        and database, so that ``settle_and_fetch`` can store them; else None."""
        # A Cluster backend is a RedisBackend too, but spreads its keys over slots that
        # one script on one server cannot write.
        if not isinstance(backend, RedisBackend) or not isinstance(backend.conn, Connector):
            return None
        theirs, mine = backend.conn.endpoint, self.conn.endpoint
        same = theirs.url == mine.url and theirs.sentinels == mine.sentinels
        return theirs.namespace if same else None

    async def settle_and_fetch(self, acks: Sequence[Delivery], results: Sequence[Stored],
                       results_namespace: str | None, queues: Sequence[str], limit: int
                       ) -> list[Delivery]:
        """Store ``results`` (in the result backend's layout, under ``results_namespace``,
        from ``results_namespace()``), ack ``acks``, then fetch up to ``limit`` ready
        messages without waiting: the worker's hot path as one script (settle_and_fetch.lua).

        A fetch that comes back short registers this consumer as idle on ``queues``:
        ``wait_ready`` then sleeps until a message is published there (or comes due)."""
        me = self._me()
        names = list(dict.fromkeys(queues)) if limit > 0 else []
        if names:
            if self._suspect:
                await self._reconcile(me, counted=False)
            if not self._idle_on.issuperset(names):
                self._idle_on.update(names)
        tags = [d.tag for d in acks]
        batch = list(dict.fromkeys([*tags, *self._unacked])) if self._unacked else tags
        if not (batch or results or names):
            return []
        if results and results_namespace is None:
            raise ValueError("settle_and_fetch: results need the result backend's namespace")
        args = self._script_args(me, limit if names else 0, results_namespace or "",
                                 len(results), len(batch))
        now = time.time()
        for stored in results:
            args += _result_args(stored, now)
        args += batch
        args += names
        # Its acks, if the reply is lost, are retried by the caller.
        with self._reply_may_be_lost(fetches=bool(names)):
            reply = await self.conn.arun("settle_and_fetch", args)
        self._unacked.clear()
        self._held.difference_update(batch)
        if names:
            self._next_due = int(reply[0])
        return self._deliveries(reply)

    def direct_settle(self, backend: ResultBackend) -> tuple[str, str] | None:
        """What a pool child needs, with a message's tag, to settle that message itself
        (``settle_here``): this consumer's id and the results' namespace. None where it
        cannot: results kept elsewhere than this server and database, TLS or Sentinel
        (``Connector.can_run_once``), or a subclass that settles otherwise (a Cluster's
        per-slot calls, the kombu layout)."""
        if type(self).settle_and_fetch is not RedisTransport.settle_and_fetch \
                or self.consumer_id is None or not self.conn.can_run_once():
            return None
        namespace = self.results_namespace(backend)
        return None if namespace is None else (self.consumer_id, namespace)

    def settle_here(self, settle: Sequence[str], stored: Stored | None) -> None:
        """In the process that ran a task (a pool child of the consumer ``settle`` names,
        from ``direct_settle`` and the message's tag): store its result and ack its
        message in one script, as ``settle_and_fetch`` does for the worker, results
        first. One attempt; raises ``OperationalError`` if it may not have run, and the
        worker settles the message as usual then (a repeat is harmless: a store
        overwrites, an ack of a message no longer owned does nothing)."""
        me, namespace, tag = settle
        args = self._script_args(me, 0, namespace, 0 if stored is None else 1, 1)
        if stored is not None:
            args += _result_args(stored, time.time())
        args.append(tag)
        self.conn.run_once("settle_and_fetch", args)

    def settled_elsewhere(self, deliveries: Sequence[Delivery]) -> None:
        """Messages a pool child settled (``settle_here``): no longer held here."""
        self._held.difference_update(d.tag for d in deliveries)

    def _script_args(self, me: str, limit: int, results_namespace: str, results: int,
                     acks: int) -> list[Any]:
        """settle_and_fetch.lua's leading arguments (its header says what follows)."""
        return [me, self._lease_ms(), limit, results_namespace, results, acks, FEED_LENGTH]

    @contextlib.contextmanager
    def _reply_may_be_lost(self, *, fetches: bool) -> Iterator[None]:
        """Around a script call that may fetch: if it fails, or its connection failed and
        was retried, the script may have run and its reply been lost. What it fetched is
        ours in Redis and we never saw it: ``_suspect`` makes the next fetch give it back."""
        failures = self.conn.async_failures
        try:
            yield
        except BaseException:
            if fetches:
                self._suspect = True
            raise
        finally:
            if fetches and self.conn.async_failures != failures:
                self._suspect = True

    async def wait_ready(self, queues: Sequence[str], limit: int, timeout: float
                         ) -> list[Delivery] | None:
        """Sleep until a message may be ready for the last ``settle_and_fetch`` that came back
        short (a publish to its queues wakes us, or a delayed message comes due), or for
        ``timeout`` seconds, then fetch up to ``limit``: the fetch is written behind the
        BLPOP on the sleeper's own connection, so Redis runs it the moment the BLPOP
        returns and both replies come back in one round trip (a wake-up costs one round
        trip, not two). Returns what it fetched; None when it only waited (no lane: TLS;
        the script was not loaded): the next ``settle_and_fetch`` fetches.

        The pump's exchanges go on meanwhile on the other connection, with ``limit`` 0
        (the consumer fetches in one place at a time): acks and results only, which touch
        none of the messages this fetch takes. A fetch after a BLPOP that timed out is an
        ordinary fetch (it registers us as idle again when it comes back short). A reply
        lost or abandoned (cancelled while it was in flight) leaves messages ours in
        Redis that we never saw: ``_suspect`` makes the next fetch give them back, and
        ``disconnect`` gives back all we own."""
        due = self._next_due
        if due == 0:
            return None  # more delayed messages are due than one fetch promotes
        me = self._me()
        wait = timeout if due < 0 else min(timeout, due / 1000)
        # Whole milliseconds, rounded up (see fetch).
        seconds = max(math.ceil(wait * 1000), 1) / 1000
        names = list(dict.fromkeys(queues)) if limit > 0 else []
        if not names:
            await self._sleep(me, seconds)
            return None
        if self._suspect:
            await self._reconcile(me, counted=False)
        args = [*self._script_args(me, limit, "", 0, 0), *names]
        with self._reply_may_be_lost(fetches=True):
            reply = await self.conn.acall(
                lambda client, ns: self._sleep_then_fetch(client, ns, me, seconds, args))
        if reply is None:
            return None
        self._next_due = int(reply[0])
        return self._deliveries(reply)

    async def _sleep_then_fetch(self, client: aredis.Redis, ns: str, me: str,
                                seconds: float, args: list[Any]) -> Any:
        """BLPOP our wake list and the fetch behind it, on the sleeper's lane: the fetch's
        reply (None: no lane, or the script had to be loaded, and the fetch did not run)."""
        lane = await self._lane_for_sleep()
        if lane is None:
            await self._blpop(client, ns, me, seconds)
            return None
        woke, fetched = lane.pipeline(
            ("BLPOP", f"{ns}:wake:{me}", f"{seconds:.3f}"),
            ("EVALSHA", script_sha("settle_and_fetch"), 0, ns, *args))
        try:
            async with asyncio.timeout(seconds + _BLOCK_GUARD):
                try:
                    # Replies come in order: once the fetch's has come, the BLPOP's has too.
                    reply = await fetched
                except redis.exceptions.NoScriptError:
                    # A restarted or flushed server: the fetch did not run. Load the
                    # script for the pump's next call, which fetches in its place.
                    await lane.call("SCRIPT", "LOAD", script_source("settle_and_fetch"))
                    reply = None
        except (asyncio.CancelledError, TimeoutError) as exc:
            woke.cancel()
            lane.close()  # a reply may still come: the connection is out of step
            if isinstance(exc, TimeoutError):
                raise redis.TimeoutError(f"no reply to BLPOP within {seconds}s") from exc
            raise
        finally:
            failed = woke.exception() if woke.done() and not woke.cancelled() else None
        if failed is not None:
            raise failed
        return reply

    async def _lane_for_sleep(self) -> AsyncLane | None:
        loop = asyncio.get_running_loop()
        held = self._sleeper_lane
        if held is not None:
            if (held[0] == self.conn.generation and held[1] is loop
                    and not held[2].broken):
                return held[2]
            self._sleeper_lane = None
            if held[1] is loop:
                held[2].close()
        opened = await self.conn.open_lane()
        if opened is None:
            return None
        self._sleeper_lane = (opened[0], loop, opened[1])
        return opened[1]

    def _close_sleeper_lane(self) -> None:
        held, self._sleeper_lane = self._sleeper_lane, None
        if held is not None:
            held[2].close()

    async def _sleep(self, me: str, seconds: float) -> None:
        """Until a token arrives on our wake list, or ``seconds`` pass."""
        await self.conn.acall(lambda client, ns: self._blpop(client, ns, me, seconds))

    @staticmethod
    async def _blpop(client: aredis.Redis, ns: str, me: str, seconds: float) -> Any:
        # BLPOP's timeout of 0 means forever: callers pass at least a millisecond.
        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a
        # cancellation that lands as the call completes (shutdown would hang).
        async with asyncio.timeout(seconds + _BLOCK_GUARD):
            return await client.blpop([f"{ns}:wake:{me}"], seconds)

    async def _reconcile(self, me: str, *, counted: bool) -> None:
        """Give back what Redis says we own and we never saw (a fetch whose reply was
        lost: uncounted). Unnoticed, those messages would stay ours, undelivered, for as
        long as we live."""
        async def owned(client: aredis.Redis, ns: str) -> set[str]:
            members = await client.smembers(f"{ns}:owned:{me}")
            return {m.decode() if isinstance(m, bytes) else m for m in members}

        # The requeue script skips any id we settled meanwhile (it checks ownership).
        lost = await self.conn.acall(owned) - self._held
        if lost:
            moved = await self.conn.arun("requeue", [me, int(not counted), 0, *sorted(lost)])
            logger.warning("gave back %d message(s) owned by consumer %r that it never "
                           "received", moved, me)
        self._suspect = False

    # -- where a consumer's scripts run: this server; per queue on a Cluster -------------
    def _by_place(self, tags: Iterable[str]) -> dict[str, list[str]]:
        """Delivery tags grouped by where their scripts run, as the scripts' ids."""
        ids = list(tags)
        return {"": ids} if ids else {}

    def _places(self) -> list[str]:
        """Where this consumer holds a lease."""
        return [""]

    def _idle_queues(self, place: str) -> list[str]:
        """The queues at ``place`` whose idle sets this consumer may be in."""
        return sorted(self._idle_on)

    async def _arun_at(self, place: str, script: str, args: list[Any]) -> Any:
        return await self.conn.arun(script, args)

    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        tags = [d.tag for d in deliveries]
        batch = list(dict.fromkeys([*tags, *self._unacked]))
        if not batch:
            return
        try:
            for place, ids in self._by_place(batch).items():
                await self._arun_at(place, "ack", [self._me(), *ids])
        except OperationalError:
            self._unacked.update(tags)
            raise
        self._unacked.clear()
        self._held.difference_update(batch)

    async def requeue(self, deliveries: Sequence[Delivery], *, redelivered: bool,
                      delay: float = 0.0) -> None:
        tags = [d.tag for d in deliveries]
        flags = [self._me(), int(not redelivered), max(round(delay * 1000), 0)]
        await self._settle(tags, "requeue", lambda ids: [*flags, *ids])

    async def dead_letter(self, delivery: Delivery, reason: str) -> None:
        await self._settle([delivery.tag], "dead_letter",
                           lambda ids: [self._me(), ids[0], reason])

    async def _settle(self, tags: list[str], script: str,
                      args: Callable[[list[str]], list[Any]]) -> None:
        try:
            for place, ids in self._by_place(tags).items():
                await self._arun_at(place, script, args(ids))
        except OperationalError:
            # The caller has let go of these messages; if Redis still has them as ours,
            # the next fetch gives them back rather than keeping them while we live.
            self._suspect = True
            raise
        finally:
            self._held.difference_update(tags)

    async def renew_lease(self) -> int:
        me = self._me()
        if self._unacked:
            try:
                await self.ack([])
            except OperationalError as exc:
                logger.warning("%d ack(s) still waiting for the broker: %s",
                               len(self._unacked), exc)
        restored = 0
        for place in self._places():
            restored += int(await self._arun_at(place, "heartbeat", [me, self._lease_ms()]))
        await self._bind_fanout(self._lease_ms() * 3)
        if restored:
            logger.warning("returned %d message(s) of dead consumers to their queues",
                           restored)
        return restored

    async def disconnect(self) -> None:
        try:
            if self.consumer_id is not None:
                if self._unacked:
                    # Before the give-back, or tasks that finished would run again.
                    await self.ack([])
                given_back = 0
                for place in self._places():
                    given_back += int(await self._arun_at(
                        place, "disconnect", [self.consumer_id, *self._idle_queues(place)]))
                if given_back:
                    logger.info("gave back %d message(s) on disconnect", given_back)
                await self._bind_fanout(0)  # a stopped worker gets no more copies
        finally:
            self._held.clear()
            self._idle_on.clear()
            await self.release()

    async def release(self) -> None:
        self._close_sleeper_lane()
        await self.conn.aclose()

    # -- administration -----------------------------------------------------------------
    def ping(self) -> None:
        self.conn.call(lambda client, ns: client.ping())

    def queue_length(self, queue: str) -> int:
        return int(self.conn.call(lambda client, ns: client.zcard(f"{ns}:q:{queue}")))

    def purge(self, queue: str) -> int:
        return int(self.conn.run("purge", [queue]))

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        if limit <= 0:
            return []
        r = self.conn.run("dead_letters", [limit])
        return [
            DeadLetter(int(r[i]), r[i + 1].decode(), r[i + 2].decode("utf-8", "replace"),
                       _message(r[i + 5], r[i + 6]), int(r[i + 3] or 0), float(r[i + 4]))
            for i in range(0, len(r), 7)
        ]

    def requeue_dead(self, ids: Sequence[int | str]) -> int:
        keys = _ids(ids)
        return int(self.conn.run("requeue_dead", keys)) if keys else 0

    def purge_dead(self, ids: Sequence[int | str] | None = None) -> int:
        if ids is not None:
            keys = _ids(ids)
            return int(self.conn.run("purge_dead", ["ids", *keys])) if keys else 0
        total = 0
        while True:  # in batches, so one call never holds Redis for long
            n = int(self.conn.run("purge_dead", ["oldest", _PURGE_BATCH]))
            total += n
            if n < _PURGE_BATCH:
                return total

    # -- broadcast ----------------------------------------------------------------------
    # Channel names come from ``Endpoint.channel`` alone (namespace and database in
    # them), read from the endpoint at the moment of the call, as the client is: after a
    # failover to a URL of another database, the names follow it.
    def broadcast(self, channel: str, payload: bytes, routing_key: str = "") -> None:
        # A plain command over the lean connection: a script would copy the payload
        # twice more on the server.
        self.conn.command(lambda ns: ("PUBLISH", self.conn.endpoint.channel(channel), payload))

    def has_subscribers(self, channel: str) -> bool:
        if self._pubsub_denied:
            return True
        try:
            # NUMSUB counts SUBSCRIBE (our receivers), not PSUBSCRIBE: any pattern
            # subscriber at all may be listening.
            return bool(self._numsub(channel)
                        or self.conn.command(lambda ns: ("PUBSUB", "NUMPAT")))
        except OperationalError as exc:
            text = str(exc)
            if "NOPERM" not in text and "unknown" not in text.lower():
                raise  # unreachable, auth, busy...: the sender backs off as for PUBLISH
            # An ACL without PUBSUB (or a server without it): send, as if heard.
            logger.info("cannot tell who subscribed (%s); broadcasting anyway", exc)
            self._pubsub_denied = True
            return True

    def control_listeners(self) -> int | None:
        """How many workers receive control commands on this namespace and database now
        (mingle waits for that many replies)."""
        return self._numsub(CONTROL_CHANNEL)

    def _numsub(self, channel: str) -> int:
        reply = self.conn.command(
            lambda ns: ("PUBSUB", "NUMSUB", self.conn.endpoint.channel(channel)))
        return int(reply[1])

    async def subscribe(self, channel: str) -> Subscription:
        async def open_(client: aredis.Redis, ns: str) -> Subscription:
            pubsub = await confirmed(client, self.conn.endpoint.channel(channel),
                                     self.settings.broker_connection_timeout)
            return RedisSubscription(pubsub, self.conn.endpoint.safe)

        return await self.conn.acall(open_)

    def close(self) -> None:
        self.conn.close()


async def confirmed(client: aredis.Redis, name: str, timeout: float, *,
                    pattern: bool = False) -> aredis.client.PubSub:
    """A pub/sub connection subscribed to ``name`` (PSUBSCRIBE with ``pattern``), once the
    server has confirmed it: only from then on is a message published ours."""
    pubsub = client.pubsub(ignore_subscribe_messages=False)
    kind = "psubscribe" if pattern else "subscribe"
    try:
        await (pubsub.psubscribe(name) if pattern else pubsub.subscribe(name))
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            msg = await pubsub.get_message(timeout=remaining)
            if msg is not None and msg["type"] == kind:
                return pubsub
        raise TimeoutError(f"no confirmation of the subscription to {name}")
    except BaseException:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        raise


class RedisSubscription(Subscription):
    """Messages of a confirmed subscription (``confirmed``); ``body`` picks what to
    return of each (None: skip it)."""

    def __init__(self, pubsub: aredis.client.PubSub, where: str) -> None:
        self.pubsub = pubsub
        self.where = where

    def body(self, data: bytes) -> bytes | None:
        return data

    async def get(self, timeout: float) -> bytes | None:
        deadline = time.monotonic() + timeout
        while True:
            remaining = max(deadline - time.monotonic(), 0.0)
            try:
                msg = await self.pubsub.get_message(ignore_subscribe_messages=True,
                                                    timeout=remaining)
            except (redis.RedisError, OSError) as exc:
                raise OperationalError(f"subscription on {self.where} lost: {exc}") from exc
            if msg is not None and msg["type"] in ("message", "pmessage"):
                body = self.body(msg["data"])
                if body is not None:
                    return body
            elif remaining <= 0:
                return None

    async def close(self) -> None:
        await self.pubsub.aclose()  # type: ignore[no-untyped-call]


def _result_args(stored: Stored, now: float) -> list[Any]:
    """A result's arguments to settle_and_fetch.lua: id, value, ms to expiry, expiry."""
    task_id, content_type, data, expires_at = stored
    return [task_id, encode_value(content_type, data),
            0 if expires_at is None else expiry_ms(expires_at, now),
            0 if expires_at is None else expires_at]


def _delay_ms(delay: float | None) -> int:
    # Rounded up: a message is never due before its time.
    return math.ceil(delay * 1000) if delay and delay > 0 else 0


def _ids(ids: Iterable[int | str]) -> list[str]:
    """Dead-letter ids (ints, or their digits) as the broker's zero-padded message ids."""
    return [f"{int(i):016d}" for i in ids if isinstance(i, int) or str(i).isdigit()]


def _message(envelope: bytes, body: bytes) -> Message:
    """A stored message: ``Message.packed()``'s form, or the ``envelope()`` of messages
    published before it (both are read, so a queue survives an upgrade)."""
    try:
        return Message.from_packed(envelope, body)
    except DecodeError as exc:
        # Keep the bytes: the consumer dead-letters it with this reason.
        return Message({DECODE_ERROR_HEADER: str(exc)}, body, "application/data")
