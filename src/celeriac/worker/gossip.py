"""The worker's side of events: its dispatcher, and the worker-online/-heartbeat/-offline
events that monitors (``celeriac events``, the dashboard) judge it alive by.

The step starts before the pool and the consumer and stops after them, so the consumer
can send task events for as long as it runs, and ``worker-offline`` goes out only once
every task in hand has finished (warm) or been given back (cold).
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
from typing import TYPE_CHECKING, Any

from ..__about__ import __version__
from ..events import EventDispatcher
from .blueprint import Step
from .steps import TimerStep

if TYPE_CHECKING:
    from .timer import Entry

logger = logging.getLogger("celeriac.worker.gossip")

SW_SYS = platform.system()
OFFLINE_FLUSH_TIMEOUT = 2.0
"""How long a stopping worker waits for its last events to reach the broker."""


class EventsStep(Step):
    requires = (TimerStep,)

    async def start(self) -> None:
        w = self.worker
        groups = {g for g, on in (("worker", w.heartbeat), ("task", w.task_events)) if on}
        self.beat: Entry | None = None
        if not groups:
            return
        w.events = EventDispatcher(w.app, hostname=w.hostname, groups=groups)
        if w.heartbeat:
            self.send("worker-online")
            interval = w.app.settings.worker_heartbeat_interval
            self.beat = w.timer.call_repeatedly(interval, self.send, "worker-heartbeat")

    def send(self, type_: str) -> None:
        w = self.worker
        if w.events is None:
            return
        consumer = getattr(w, "consumer", None)
        pool = getattr(w, "pool", None)
        fields: dict[str, Any] = {
            "freq": w.app.settings.worker_heartbeat_interval,
            "active": len(pool.running()) if pool is not None else 0,
            "processed": consumer.processed if consumer is not None else 0,
            "loadavg": _loadavg(),
            "sw_ident": "celeriac",
            "sw_ver": __version__,
            "sw_sys": SW_SYS,
        }
        w.events.send(type_, **fields)

    async def stop(self) -> None:
        await self._offline()

    async def terminate(self) -> None:
        # Also on a cold shutdown: monitors should not have to wait for the heartbeat to
        # expire to learn that this worker is gone.
        await self._offline()

    async def _offline(self) -> None:
        w = self.worker
        if self.beat is not None:
            self.beat.cancel()
        if w.events is None:
            return
        consumer = getattr(w, "consumer", None)
        if consumer is not None and consumer.events is not None:
            consumer.events.flush()  # task events of the last moments go before offline
        if w.heartbeat:
            self.send("worker-offline")
        events, w.events = w.events, None
        # close() waits on the sender thread; keep the loop free meanwhile.
        await asyncio.get_running_loop().run_in_executor(None, events.close,
                                                         OFFLINE_FLUSH_TIMEOUT)


def _loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not available on this platform
        return [0.0, 0.0, 0.0]
