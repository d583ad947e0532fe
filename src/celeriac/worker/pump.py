"""The pump: the consumer's broker calls on the hot path, one at a time.

It stores the results of finished tasks, acks their messages and fetches more in one
call (one script on Redis when the results live on the broker's server). Completions
gather while a call is in flight, so batches grow with the load and a lone task is
settled at once. When the queues are empty, a sleeper waits in the broker while the pump
goes on settling. Ordering: a result is stored before, or in the same script as, its
message's ack; a dead letter, a task's final event and a unique lock wait for their
result to be stored too.

What to fetch, and what to do with what comes, is the consumer's (``Consumer.want``,
``Consumer.ingest``): the pump only moves messages between it and the broker.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ..clients.net import backoff
from .timer import TICK

if TYPE_CHECKING:
    from ..app import Celeriac
    from ..backends.base import Stored
    from ..events import Event
    from ..protocol import Delivery
    from ..transports.base import Transport
    from .consumer import Consumer

logger = logging.getLogger("celeriac.worker.consumer")

FETCH_TIMEOUT = 1.0
"""Longest wait of one blocking fetch; the sleeper then asks again."""
LINGER = 0.002
"""Seconds a busy worker may hold finished tasks' results and acks to batch them."""
LINGER_BATCH = 64
"""...unless this many are waiting."""
POLL = 0.001
"""Seconds between fetches while arrivals are dense (``Pump.dense``)."""
DENSE_ENTER = 3
"""A fetch that brings at least this many while the queues run dry: arrivals are dense..."""
DENSE_LEAVE = 0
"""...until a poll brings no more than this many."""


class Pump:
    def __init__(self, consumer: Consumer, app: Celeriac, transport: Transport) -> None:
        self.consumer = consumer
        self.app = app
        self.transport = transport
        self.acks: list[Delivery] = []
        self.results: list[Stored] = []
        self.after: list[tuple[Delivery, str]] = []
        """Dead letters that wait for their result to be stored first."""
        self.finals: list[Event] = []
        """Task events that wait for their result to be stored first."""
        self.wake = asyncio.Event()
        """Set when there is something to settle, or room to fetch."""
        self.quiet = asyncio.Event()  # set while no turn is in flight (ConsumerStep's too)
        self.quiet.set()
        self.fetching = False
        self.drained = False
        """The last fetch came back short: the next one waits in the broker (sleeper)."""
        self.dense = False
        """Arrivals outpace a wake-up per message: the pump polls every ``POLL`` seconds,
        its acks riding with the fetches, instead of the sleeper waking per message."""
        self._polled = 0.0  # when the pump or the sleeper last fetched
        self.closing = False
        self.failures = 0
        self.sleeper: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._lingering: asyncio.TimerHandle | None = None
        """While the pump holds finished tasks to batch them (``_linger``): the timer
        that ends the hold."""
        self._held_long = False  # that timer fired
        self._executor: ThreadPoolExecutor | None = None

    # -- what the consumer hands over -----------------------------------------------------
    def ack(self, delivery: Delivery) -> None:
        self.acks.append(delivery)
        self.wake.set()

    def store(self, stored: Stored) -> None:
        """A result to store with the next turn (before any ack that follows it)."""
        self.results.append(stored)

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        """Dead-letter ``delivery`` once the results before it are stored."""
        self.after.append((delivery, reason))
        self.wake.set()

    def final(self, event: Event) -> None:
        """Send a task's final event once its result is stored."""
        self.finals.append(event)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.fetching = True
        self._task = loop.create_task(self._run())
        self._task.add_done_callback(self.consumer.ended)

    async def stop_fetching(self) -> None:
        """Fetch no more. On return, every message fetched has been ingested."""
        self.fetching = False
        if self.sleeper is not None:
            self.sleeper.cancel()
            await asyncio.gather(self.sleeper, return_exceptions=True)
        # A turn in flight may bring messages: they must land before a give-back.
        try:
            async with asyncio.timeout(self._guard()):
                await self.quiet.wait()
        except TimeoutError:
            await self._abandon("fetching")

    async def flush(self) -> None:
        """Settle what finished (results, acks), then stop."""
        self.closing = True
        self.wake.set()
        if self._task is not None:
            try:
                async with asyncio.timeout(self._guard()):
                    await asyncio.gather(self._task, return_exceptions=True)
            except TimeoutError:
                await self._abandon("settling")
            self._task = None
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None

    def _guard(self) -> float:
        # How long stopping waits for a turn in flight: a broker that neither
        # answers nor drops the connection must not hold the shutdown forever.
        return 2 * self.app.settings.broker_connection_timeout + 1

    async def _abandon(self, doing: str) -> None:
        logger.error("the broker did not answer within %.0fs while %s; stopping without "
                     "it (what this worker holds is redelivered when its lease ends)",
                     self._guard(), doing)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self.quiet.set()

    # -- the loop -------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            limit = self._fetch_limit()
            if not (self.acks or self.results or self.after or self.finals or limit):
                if self.closing:
                    return
                self.wake.clear()
                await self.wake.wait()
                continue
            if not limit and await self._linger(len(self.acks) + len(self.results)):
                continue
            if limit and self.dense and self.drained and await self._poll_wait():
                continue
            if not await self._turn(limit):
                return

    def _fetch_limit(self) -> int:
        """How many messages this turn fetches: 0 while the sleeper waits in
        the broker for them (started here when the last fetch came back short)."""
        limit = self.consumer.want()
        if limit and self.drained and not self.dense:
            self.sleeper = self.loop.create_task(self._sleep(limit))
            self.sleeper.add_done_callback(self.consumer.ended)
            return 0
        return limit

    async def _turn(self, limit: int) -> bool:
        """One turn: store the results waiting, settle their messages, fetch up to
        ``limit``. False when the pump must end (it failed while the worker stops)."""
        acks, results, after, finals = self.acks, self.results, self.after, self.finals
        if self._lingering is not None:
            self._lingering.cancel()
            self._lingering = None
        self.acks, self.results, self.after, self.finals = [], [], [], []
        flow = self.consumer.flow
        unlocks = flow.take_after_store() if flow is not None else []
        self.quiet.clear()
        try:
            batch = await self._settle_and_fetch(acks, results, limit)
        except asyncio.CancelledError:
            self._put_back(acks, results, after, finals, unlocks)
            raise
        except Exception as exc:
            if self.closing:
                logger.error("could not settle %d message(s) and store %d result(s) before "
                             "stopping (%s: %s); the broker will redeliver them",
                             len(acks) + len(after), len(results), type(exc).__name__, exc)
                return False
            self._put_back(acks, results, after, finals, unlocks)
            await self._failed("storing results and settling messages", exc)
            return True
        finally:
            self.quiet.set()
        self._restored()
        if flow is not None:
            flow.unlock(unlocks)  # their results are stored
        for delivery, reason in after:
            self.consumer.spawn(self.transport.dead_letter(delivery, reason))
        events = self.consumer.events
        if finals and events is not None:
            events.put_all(finals)
        if limit:
            self._polled = self.loop.time()
            self.drained = len(batch) < limit
            self._density(len(batch))
        if batch:
            self.consumer.ingest(batch)
        return True

    def _density(self, fetched: int) -> None:
        """Whether arrivals are dense, from a fetch of ``fetched`` messages. A wake-up per
        message costs the worker and Redis about 1.7 times a drained task's CPU (the
        wake, a fetch and an ack each alone): at half the maximum drain that fills two
        CPUs, a backlog forms, the worker drains it in batches, and the cycle repeats
        with latencies of tens of milliseconds (docs/speed.md, "Latency under load").
        A fetch that finds a backlog says the wake-ups fall behind; polling then costs
        one round trip per ``POLL`` for every arrival in it, acks included, at the
        price of up to ``POLL`` of waiting. A poll that finds nothing says a wake-up per
        message keeps up again (one that finds even one costs no more than the wake-up
        it replaces). An idle worker's round trip fetches one message at a time and
        never polls."""
        if fetched >= DENSE_ENTER:
            self.dense = True
        elif fetched <= DENSE_LEAVE:
            self.dense = False

    async def _poll_wait(self) -> bool:
        """Wait until the next poll is due (dense arrivals): True if it waited."""
        remaining = self._polled + POLL - self.loop.time()
        if remaining < TICK or self.closing:
            return False
        await asyncio.sleep(remaining)
        return True

    async def _linger(self, pending: int) -> bool:
        """Wait a moment for more to settle, when more is about to finish: True if it
        waited. Without it a busy worker settled about two tasks per broker call; with
        it batches grow with the load. A lone task is settled at once."""
        if self.closing or pending >= LINGER_BATCH or self.consumer.in_pool() <= 0:
            return False
        if self._lingering is None:
            # One timer for the whole hold, not one per completion that wakes the pump
            # during it: a drain wakes it for most completions.
            self._held_long = False
            self._lingering = self.loop.call_later(LINGER, self._hold_ends)
        elif self._held_long:
            return False
        self.wake.clear()
        await self.wake.wait()
        return True

    def _hold_ends(self) -> None:
        self._held_long = True
        self.wake.set()

    async def _settle_and_fetch(self, acks: list[Delivery], results: list[Stored], limit: int
                                ) -> list[Delivery]:
        namespace = self.transport.results_namespace(self.app.backend) if results else None
        if results and namespace is None:
            await self._store(results)
            results = []
        if not (acks or results or limit):
            return []
        return await self.transport.settle_and_fetch(acks, results, namespace,
                                                     self.consumer.queues, limit)

    async def _store(self, results: list[Stored]) -> None:
        backend = self.app.backend
        if not backend.network:
            backend.store_many(results)
            return
        # A thread, so that a slow result server cannot stall heartbeats and acks.
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="celeriac-results")
        await self.loop.run_in_executor(self._executor, backend.store_many, results)

    def _put_back(self, acks: list[Delivery], results: list[Stored],
                  after: list[tuple[Delivery, str]], finals: list[Event],
                  unlocks: list[tuple[dict[str, Any], str]]) -> None:
        # In front of what came meanwhile: the next turn retries them (a repeat is
        # harmless: stores overwrite, acks of settled messages are no-ops).
        self.acks[:0] = acks
        self.results[:0] = results
        self.after[:0] = after
        self.finals[:0] = finals
        flow = self.consumer.flow
        if flow is not None:
            flow.after_store[:0] = unlocks

    async def _sleep(self, limit: int) -> None:
        """Wait in the broker for messages (the queues were empty when last fetched)."""
        try:
            while limit:
                try:
                    got = await self.transport.wait_ready(self.consumer.queues, limit,
                                                          FETCH_TIMEOUT)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    # Still the sleeper while it backs off: no second one starts meanwhile.
                    await self._failed("fetching from the broker", exc)
                    return
                self._restored()
                # None: it only waited; the next turn fetches what woke it.
                batch = got or []
                self.drained = got is not None and len(batch) < limit
                if got is not None:
                    self._polled = self.loop.time()
                    self._density(len(batch))
                if batch:
                    self.consumer.ingest(batch)
                # Still short: wait again from here, as the pump would after one more
                # wake-up of its own (an idle worker's every task); else the pump fetches
                # (or polls: dense arrivals).
                limit = self.consumer.want(sleeping=True) \
                    if self.drained and not self.dense else 0
        finally:
            self.sleeper = None
            self.wake.set()

    async def _failed(self, doing: str, exc: Exception) -> None:
        # The broker (or result store) went away: back off (exponential, with jitter so a
        # fleet of workers does not reconnect in lockstep) and try again, for as long as
        # the worker runs. Messages in hand keep running; what they finish waits.
        self.failures += 1
        delay = backoff(self.failures)
        logger.error("%s failed (%s: %s); retry %d in %.1fs", doing, type(exc).__name__,
                     exc, self.failures, delay)
        await asyncio.sleep(delay)

    def _restored(self) -> None:
        if self.failures:
            logger.warning("broker connection restored after %d failed attempt(s)",
                           self.failures)
            self.failures = 0
