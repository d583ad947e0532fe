"""The autoscaler: grows the prefork pool with backlog, shrinks it after a quiet spell.

Every second: the backlog is what waits in the broker on this worker's queues plus what
the consumer holds reserved (fetched, not started). If there is backlog while no child is
free, grow by the backlog up to ``max``; if some child has been idle for the whole
cool-down, shrink by one down to ``min``.

The broker's count matters because the consumer fetches at most ``pool size x
worker_prefetch_multiplier``: with multiplier 1 (usual for long tasks) it reserves nothing
beyond what runs, so its own backlog stays 0 however long the queue is.
"""

from __future__ import annotations

import asyncio
import logging

from .blueprint import Step
from .pool.prefork import PreforkPool
from .steps import ConsumerStep

logger = logging.getLogger("celeriac.worker.autoscale")

INTERVAL = 1.0


class Autoscaler(Step):
    requires = (ConsumerStep,)

    async def start(self) -> None:
        w = self.worker
        bounds = w.autoscale
        if bounds is None:
            self.entry = None
            return
        if not isinstance(w.pool, PreforkPool):
            raise ValueError("autoscale needs the prefork pool")
        self.max, self.min = bounds
        self.cooldown = w.app.settings.worker_autoscale_cooldown
        self.busy_since = w.timer.time()
        self.failing = False
        # A coroutine: the Timer starts no tick while the last one runs, so at most one
        # broker call is in flight however slow the broker is.
        self.entry = w.timer.call_repeatedly(INTERVAL, self.tick)

    async def tick(self) -> None:
        waiting = await self.waiting()
        pool = self.worker.pool
        assert isinstance(pool, PreforkPool)
        if waiting is None or pool.closing:
            return
        now = self.worker.timer.time()
        backlog = waiting + len(self.worker.consumer.reserved)
        free = pool.free_slots()
        if free == 0:
            self.busy_since = now
        if backlog and not free and pool.concurrency < self.max:
            pool.grow(min(backlog, self.max - pool.concurrency))
            self.busy_since = now
        elif free and pool.concurrency > self.min and now - self.busy_since >= self.cooldown:
            pool.shrink(1)
            self.busy_since = now

    async def waiting(self) -> int | None:
        """Messages ready in the broker on this worker's queues; None if it cannot tell."""
        consumer = self.worker.consumer

        def count() -> int:
            return sum(consumer.transport.queue_length(q) for q in consumer.queues)

        try:
            # queue_length is a synchronous admin call (it may retry for a while): a
            # thread keeps it off the loop, which runs the pool and the consumer.
            n = await asyncio.to_thread(count)
        except Exception as exc:
            # Once per outage, not every second; the pool keeps its size meanwhile.
            if not self.failing:
                logger.warning("autoscaler cannot read the queues' length (%s: %s); "
                               "not resizing until it can", type(exc).__name__, exc)
                self.failing = True
            return None
        if self.failing:
            logger.info("autoscaler reads the queues' length again")
            self.failing = False
        return n

    async def stop(self) -> None:
        if self.entry is None:
            return
        self.entry.cancel()
        # A tick waiting on the broker must not resize the pool once it is stopping.
        tick = self.entry.running
        if tick is not None and not tick.done():
            tick.cancel()
            await asyncio.gather(tick, return_exceptions=True)
