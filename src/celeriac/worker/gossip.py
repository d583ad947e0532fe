"""``Gossip`` (Celery's step name): the other workers alive now, and elections.

**The live set.** The step subscribes to the events channel (an ``EventReceiver`` over
the transport's broadcast) and feeds other workers' ``worker-online``,
``worker-heartbeat`` and ``worker-offline`` events to a ``ClusterState``, which judges
them as monitors do: a worker is alive while its last event is at most twice its
heartbeat interval (``freq``) old, until it says ``worker-offline``. ``LiveSet`` logs
one line when a worker joins and one when it leaves (offline, or silent), checked for
the sender on each event and for every live worker once a second. ``worker.gossip.live``
is the set of the others' names (Mingle may use its size). The cost: every worker reads
the events channel, so with ``-E`` each also decodes the cluster's task events;
``--without-gossip`` skips the step. Anyone who can publish events can send a burst (a
buggy monitor, thousands of fake heartbeats): each event costs the same whatever is
known, the receiver lets the loop turn every few milliseconds while it works through
one (``events.receiver.SLICE``), and hostnames seen once are forgotten a minute after
their heartbeats expire.

**Elections**, for cluster singletons (one beat, one cleanup job): ``election(name)``
makes this worker a candidate from then on and answers, without blocking, whether it is
the leader now. The leader is whoever holds a lease in the cluster's shared store
(``celeriac.stores``: Redis ``SET NX PX``, a PostgreSQL or SQLite row). Chosen
over a deterministic pick from the live set because that is only as good as every
worker's view of the set: during a partition, or while heartbeats are late, two workers
would both lead. The store's atomic write makes at most one holder at a time.

Every candidate tries to take or renew the lease every ``ttl / 4`` (``ttl`` = twice the
heartbeat interval, like the live set's judgement). A candidate believes it leads only
until ``ttl`` minus a margin after it *sent* the request that won, so it stops believing
before the store can hand the lease to someone else (clocks may differ between machines;
their rates, over seconds, do not meaningfully). A leader that dies is replaced within
about ``ttl + ttl / 4``; one that stops (warm or cold) releases its leases at once.
Without a shared store (RabbitMQ with a result backend that is not Redis or
PostgreSQL), ``election()`` raises ``ConfigurationError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..stores import store_for
from .blueprint import Step
from .globalrate import StoreRunner
from .heart import Heart
from .steps import ConsumerStep

if TYPE_CHECKING:
    from ..events.dispatcher import Event
    from ..stores import SharedStore
    from .timer import Entry

logger = logging.getLogger("celeriac.worker.gossip")

CHECK_INTERVAL = 1.0
"""Seconds between looks for workers whose heartbeats stopped."""
FORGET_AFTER = 60.0
"""Seconds after its heartbeats expired that a dead worker is forgotten."""
LOG_LINES = 20
"""Join and leave lines logged one by one per check; the rest are counted in one line."""
MARGIN = 0.1
"""Part of the lease a leader gives up believing early (request time, loop delays)."""


class LiveSet:
    """Other workers alive by their events; ``clock`` is injectable for tests.

    What it costs stays linear in the events, whoever sends them: an event is judged for
    its own sender only (one look), since nothing else's membership can change with it;
    ``check()``, once a second, looks at the workers live (silence, LRU eviction) and
    forgets those dead for ``FORGET_AFTER`` s. Join and leave lines are logged one by
    one up to ``LOG_LINES`` per check, the rest counted in one line at the check.
    """

    def __init__(self, me: str, clock: Callable[[], float] = time.time) -> None:
        self.me = me
        self.clock = clock
        # Imported here, not with the module: the cluster state is a worker's only use of
        # it, and the step starts after the consumer's first fetch, off the first task's path.
        from ..events.state import ClusterState

        self.state = ClusterState(max_tasks_in_memory=1, clock=clock)
        self._live: set[str] = set()
        # ``live`` may be read from another thread (a hook, the solo pool): it gets an
        # immutable copy, made on the first read after a change.
        self._lock = threading.Lock()
        self._frozen: frozenset[str] | None = frozenset()
        self._lines = LOG_LINES
        self._unlogged = [0, 0]  # joins, leaves beyond the lines of this check

    @property
    def live(self) -> frozenset[str]:
        with self._lock:
            if self._frozen is None:
                self._frozen = frozenset(self._live)
            return self._frozen

    def event(self, event: Event) -> None:
        kind, host = event.get("type"), event.get("hostname")
        if not isinstance(kind, str) or not kind.startswith("worker-") \
                or not isinstance(host, str) or host == self.me:
            return
        # Received now by our clock: a sender's clock may be off by more than freq.
        now = self.clock()
        self.state.event({**event, "local_received": now})
        worker = self.state.workers.get(host)
        alive = worker is not None and worker.alive_at(now)
        if alive != (host in self._live):
            self._change(host, alive)

    def check(self) -> None:
        """Workers gone silent or evicted leave; long-dead ones are forgotten."""
        workers, now = self.state.workers, self.clock()
        for host in [h for h in self._live
                     if (w := workers.get(h)) is None or not w.alive_at(now)]:
            self._change(host, False)
        self.state.forget_workers(FORGET_AFTER)
        joined, left = self._unlogged
        if joined or left:
            logger.info("%d more worker(s) joined and %d left, not logged one by one (%d "
                        "other worker(s) live)", joined, left, len(self._live))
        self._lines, self._unlogged = LOG_LINES, [0, 0]

    def _change(self, host: str, alive: bool) -> None:
        with self._lock:
            if alive:
                self._live.add(host)
            else:
                self._live.discard(host)
            self._frozen = None
        if self._lines <= 0:  # a burst (fake events, a fleet starting): bound the log
            self._unlogged[0 if alive else 1] += 1
            return
        self._lines -= 1
        if alive:
            logger.info("%s joined (%d other worker(s) live)", host, len(self._live))
            return
        worker = self.state.workers.get(host)
        why = "offline" if worker is None or worker.offline else \
            f"no heartbeat for {self.clock() - (worker.last_heartbeat or 0):.1f}s"
        logger.info("%s left (%s; %d other worker(s) live)", host, why, len(self._live))


class Campaign:
    __slots__ = ("leader_until", "name", "won")

    def __init__(self, name: str) -> None:
        self.name = name
        self.leader_until = 0.0
        """Monotonic time until which this worker may act as the leader."""
        self.won = False


class Gossip(Step):
    requires = (Heart,)
    live_set: LiveSet

    async def start(self) -> None:
        w = self.worker
        consuming = w.steps.get(ConsumerStep)
        if isinstance(consuming, ConsumerStep):
            # Its start (an import, a transport, a subscription: a few ms of CPU) after
            # the consumer's first fetch is back and dispatched, not before (issue 30).
            await consuming.first_turn()
        self.ttl = 2 * w.app.settings.worker_heartbeat_interval
        self.campaigns: dict[str, Campaign] = {}
        self.store: SharedStore | None = None
        self.runner = StoreRunner("celeriac-gossip")
        self._round: asyncio.Task[None] | None = None
        self.loop = asyncio.get_running_loop()
        from ..events.receiver import EventReceiver  # as ClusterState, in LiveSet

        # Events are handed to the live set only by _run, which starts once it is made.
        self.receiver = EventReceiver(w.app, {"*": lambda event: self.live_set.event(event)})
        await self.receiver.open()  # events sent after this are seen
        # The live set (the cluster state's import) after that wait, during which the
        # consumer's first tasks are dispatched: off their path. worker.gossip is set only
        # now, when ``live`` can be read.
        self.live_set = LiveSet(w.hostname)
        w.gossip = self
        self._follow = asyncio.get_running_loop().create_task(self._run())
        self.checks: Entry = w.timer.call_repeatedly(CHECK_INTERVAL, self.live_set.check)
        self.renewals: Entry = w.timer.call_repeatedly(self.ttl / 4, self._campaign)

    @property
    def live(self) -> frozenset[str]:
        """The other workers alive now (node names)."""
        return self.live_set.live

    async def _run(self) -> None:
        while True:
            try:
                event = await self.receiver.get(CHECK_INTERVAL)
                if event is not None:
                    self.receiver.process(event)
            except asyncio.CancelledError:
                raise
            except Exception:  # the receiver resubscribes by itself; this is a bug
                logger.exception("gossip: reading events failed")
                await asyncio.sleep(CHECK_INTERVAL)

    # -- elections ----------------------------------------------------------------------
    def election(self, name: str) -> bool:
        """Stand in the election ``name`` from now on; True while this worker leads.
        Never blocks; callable from any thread of the worker's process (its loop, the
        solo pool's thread, a hook), not from a prefork child."""
        campaign = self.campaigns.get(name)
        if campaign is None:
            self._store()  # no store: ConfigurationError now, in the caller
            campaign = self.campaigns.setdefault(name, Campaign(name))
            try:
                here = asyncio.get_running_loop()
            except RuntimeError:
                here = None
            if here is self.loop:
                self._campaign()
            else:
                self.loop.call_soon_threadsafe(self._campaign)
        return time.monotonic() < campaign.leader_until

    async def elect(self, name: str) -> bool:
        """``election(name)``, after one round with the store: the answer is current."""
        self.election(name)
        while self._round is not None and not self._round.done():
            await asyncio.shield(self._round)
        self._campaign()
        if self._round is not None:
            await asyncio.shield(self._round)
        return self.election(name)

    def _store(self) -> SharedStore:
        if self.store is None:
            self.store = store_for(self.worker.app.settings, "Gossip's election()")
        return self.store

    def _campaign(self) -> None:
        # One round at a time: a slow store must not pile requests up.
        if self.campaigns and (self._round is None or self._round.done()):
            self._round = self.loop.create_task(self._renew())

    async def _renew(self) -> None:
        store, owner = self._store(), self.worker.id
        for campaign in list(self.campaigns.values()):
            sent = time.monotonic()
            try:
                won = await self.runner.call(store.acquire, campaign.name, owner, self.ttl)
            except Exception as exc:
                # Unknown: the lease may run out meanwhile, so stop believing we lead
                # when our last lease would have ended (already the case by the clock).
                logger.warning("election %r: the %s store failed (%s: %s)", campaign.name,
                               store.kind, type(exc).__name__, exc)
                won = False
            if won:
                campaign.leader_until = sent + self.ttl * (1 - MARGIN)
            if won != campaign.won:
                campaign.won = won
                logger.info("%s election %r", "won" if won else "lost", campaign.name)

    async def _resign(self) -> None:
        won = [c.name for c in self.campaigns.values() if c.won]
        self.campaigns.clear()
        if not won or self.store is None:
            return
        store, owner = self.store, self.worker.id
        for name in won:
            # The next candidate need not wait for the lease to run out.
            try:
                await self.runner.call(store.release, name, owner)
                logger.info("left election %r", name)
            except Exception as exc:
                logger.warning("election %r: could not release the lease (%s); it ends "
                               "in %gs", name, exc, self.ttl)

    async def stop(self) -> None:
        self.checks.cancel()
        self.renewals.cancel()
        for task in (self._follow, self._round):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2):
                await self._resign()
        await self.receiver.close()
        self.runner.close()
        if self.store is not None:
            self.store.close()
