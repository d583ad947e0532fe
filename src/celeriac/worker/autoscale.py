"""The autoscaler: grows the prefork pool with backlog, shrinks it after a quiet spell.

Every second: if messages wait in the consumer (reserved, not started) while no child is
free, grow by the backlog up to ``max``; if some child has been idle for the whole
cool-down, shrink by one down to ``min``.
"""

from __future__ import annotations

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
        self.entry = w.timer.call_repeatedly(INTERVAL, self.tick)

    def tick(self) -> None:
        pool = self.worker.pool
        assert isinstance(pool, PreforkPool)
        now = self.worker.timer.time()
        backlog = len(self.worker.consumer.reserved)
        free = pool.free_slots()
        if free == 0:
            self.busy_since = now
        if backlog and not free and pool.concurrency < self.max:
            pool.grow(min(backlog, self.max - pool.concurrency))
            self.busy_since = now
        elif free and pool.concurrency > self.min and now - self.busy_since >= self.cooldown:
            pool.shrink(1)
            self.busy_since = now

    async def stop(self) -> None:
        if self.entry is not None:
            self.entry.cancel()
