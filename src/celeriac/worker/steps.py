"""The worker's default steps: Timer -> Pool -> Consumer, and Heart beside the Consumer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from ..errors import BrokerError, BrokerLost
from .blueprint import Step
from .consumer import Consumer
from .pool import POOLS
from .pool.base import NullClient, Pool
from .timer import Entry, Timer

logger = logging.getLogger("celeriac.worker.steps")

FIRST_TURN_WAIT = 0.5
"""Seconds at most a step that waits for the consumer's first turn waits."""


class TimerStep(Step):
    async def start(self) -> None:
        self.worker.timer = Timer()

    async def stop(self) -> None:
        self.worker.timer.cancel_all()


class PoolStep(Step):
    requires = (TimerStep,)

    async def start(self) -> None:
        w = self.worker
        cls = POOLS[w.pool_name]
        # Until the consumer attaches (ConsumerStep), the pool's only report that matters
        # is a fatal one: the worker's fail() takes it.
        self.pool: Pool = cls(w.app, w.concurrency, timer=w.timer, client=NullClient(w.fail))
        self.pool.task_events = w.task_events
        w.pool_started(self.pool)
        # Forks wait for the events thread to leave its broker client (events/forking.py):
        # a child never inherits a C library's mutex held by that thread.
        await self.pool.start()

    async def stop(self) -> None:
        await self.pool.join()
        await self.pool.stop()

    async def terminate(self) -> None:
        await self.pool.terminate()


class ConsumerStep(Step):
    """Connects to the broker as this worker and feeds the pool."""

    requires = (PoolStep,)

    async def start(self) -> None:
        w = self.worker
        self.transport = w.app.transport
        await self.transport.connect(w.id)
        self.consumer = Consumer(w, self.transport, w.pool)
        w.consumer = self.consumer
        await self.consumer.bind_queues()  # fanout and worker_direct queues
        # The lease renewal belongs to this step, not to one stopped before it: it must
        # go on while a warm shutdown waits for running tasks, or a task running longer
        # than the lease would be handed to another worker.
        lease = w.app.settings.worker_lease_timeout
        self.outage: float | None = None
        """When lease renewal started failing (monotonic), while it fails."""
        self.lease = w.timer.call_repeatedly(max(lease / 4, 0.05), self._renew_lease)
        self.consumer.start()

    async def first_turn(self, timeout: float = FIRST_TURN_WAIT) -> None:
        """Return once the consumer's first turn with the broker is back and what it
        fetched dispatched (at most ``timeout`` s): a step that starts later and costs
        CPU before its first wait (Gossip) then starts off the first tasks' path."""
        await asyncio.sleep(0)  # the pump, created by start(), begins its turn
        quiet = self.consumer.quiet  # cleared while a turn is in flight
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await quiet.wait()

    async def _renew_lease(self) -> None:
        try:
            await self.transport.renew_lease()
        except BrokerLost as exc:
            logger.critical("%s; this worker stops (restart it once the broker is back)", exc)
            self.worker.fail(str(exc))
            return
        except (BrokerError, ConnectionError, TimeoutError, OSError) as exc:
            # An outage: one line when it starts and one when it ends, not a traceback
            # every tick (the fetch loop reports its own retries meanwhile).
            if self.outage is None:
                self.outage = time.monotonic()
                logger.warning("lease renewal failed (%s: %s); retrying quietly until "
                               "the broker answers", type(exc).__name__, exc)
            return
        if self.outage is not None:
            logger.warning("lease renewal works again after %.1fs",
                           time.monotonic() - self.outage)
            self.outage = None

    async def stop(self) -> None:
        c = self.consumer
        await c.stop_fetching()
        await c.worker.pool.recall_queued()  # not started: given back with the reserved
        given_back = await c.give_back_reserved()
        running = len(c.worker.pool.running())
        logger.warning("warm shutdown: %d task(s) running, %d prefetched message(s) given back",
                       running, given_back)
        await c.worker.pool.join()
        await c.flush()
        await self.transport.disconnect()
        self.lease.cancel()

    async def terminate(self) -> None:
        c = self.consumer
        await c.stop_fetching()
        running = len(c.worker.pool.running())
        logger.warning("cold shutdown: %d running task(s) and %d prefetched message(s) "
                       "given back", running, len(c.reserved))
        # Kill first, then give back: a task that finished between a give-back and the
        # kill would run twice. What finished before the kill is settled by the flush.
        await c.worker.pool.terminate()
        await c.flush()
        # disconnect() returns every message this worker still owns, running ones too.
        await self.transport.disconnect()
        self.lease.cancel()


FIRST_CLEANUP = 5.0
"""Seconds after start of the results cleanup's first pass (at most its interval)."""


class ResultsCleanup(Step):
    """Deletes expired results now and then (``result_expires``): every tenth of it (at
    most 300 s), the first time ``FIRST_CLEANUP`` s after the worker starts."""

    requires = (ConsumerStep,)

    async def start(self) -> None:
        w = self.worker
        expires = w.app.settings.result_expires
        self.cleanup: Entry | None = None
        self.first: Entry | None = None
        if expires:
            interval = min(expires / 10, 300.0)
            self.cleanup = w.timer.call_repeatedly(interval, self._cleanup)
            if interval > FIRST_CLEANUP:
                # Not at once: the first pass (a connection of its own, a blocking call on
                # the loop) would hold up the first tasks, fetched as this step starts.
                self.first = w.timer.call_after(FIRST_CLEANUP, self._cleanup)

    def _cleanup(self) -> None:
        removed = self.worker.app.backend.cleanup()
        if removed:
            logger.info("removed %d expired result(s)", removed)

    async def stop(self) -> None:
        for entry in (self.first, self.cleanup):
            if entry is not None:
                entry.cancel()


DEFAULT_STEPS: tuple[type[Step], ...] = (TimerStep, PoolStep, ConsumerStep, ResultsCleanup)
