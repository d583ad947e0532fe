"""The worker's side of events: its dispatcher (``EventsStep``), and the worker-online,
-heartbeat and -offline events that monitors (``celeriac events``, the dashboard) judge
it alive by (``Heart``, Celery's name for that step).
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

logger = logging.getLogger("celeriac.worker.heart")

SW_SYS = platform.system()
OFFLINE_FLUSH_TIMEOUT = 2.0
"""How long a stopping worker waits for its last events to reach the broker."""


class EventsStep(Step):
    """The worker's event dispatcher (``worker.events``), when it sends any events. It
    starts first after the Timer and stops last before it: the consumer can send task
    events for as long as it runs."""

    requires = (TimerStep,)

    async def start(self) -> None:
        w = self.worker
        groups = {g for g, on in (("worker", w.heartbeat), ("task", w.task_events)) if on}
        if groups:
            # Held: its sender (a thread, a connection) starts once every step has
            # (``Worker.run_async``), after the first tasks are dispatched; worker-online
            # and what follows wait in its queue, in order, until then (issue 30).
            w.events = EventDispatcher(w.app, hostname=w.hostname, groups=groups,
                                       hold=True)

    async def stop(self) -> None:
        w = self.worker
        events, w.events = w.events, None
        if events is not None:
            # close() waits on the sender thread; keep the loop free meanwhile.
            await asyncio.get_running_loop().run_in_executor(None, events.close,
                                                             OFFLINE_FLUSH_TIMEOUT)

    async def terminate(self) -> None:
        await self.stop()


class Heart(Step):
    """Celery's Heart: ``worker-online`` when the worker starts, ``worker-heartbeat``
    every ``worker_heartbeat_interval`` seconds, ``worker-offline`` when it stops (warm
    or cold), unless ``--without-heartbeat``. It starts before the pool and stops after
    it, so ``worker-offline`` goes out only once every task in hand has finished (warm)
    or been given back (cold)."""

    requires = (EventsStep,)

    async def start(self) -> None:
        w = self.worker
        self.beat: Entry | None = None
        if w.events is None or not w.heartbeat:
            return
        self.send("worker-online")
        interval = w.app.settings.worker_heartbeat_interval
        self.beat = w.timer.call_repeatedly(interval, self.send, "worker-heartbeat")

    def send(self, type_: str) -> None:
        w = self.worker
        if w.events is None:
            return
        fields: dict[str, Any] = {
            "freq": w.app.settings.worker_heartbeat_interval,
            "active": w.active_tasks(),
            "processed": w.processed,
            "loadavg": _loadavg(),
            "sw_ident": "celeriac",
            "sw_ver": __version__,
            "sw_sys": SW_SYS,
        }
        w.events.send(type_, **fields)

    async def stop(self) -> None:
        self._offline()

    async def terminate(self) -> None:
        # Also on a cold shutdown: monitors should not have to wait for the heartbeat to
        # expire to learn that this worker is gone.
        self._offline()

    def _offline(self) -> None:
        w = self.worker
        if self.beat is not None:
            self.beat.cancel()
            self.beat = None
        if w.events is None:
            return
        w.flush_task_events()  # task events of the last moments go before offline
        if w.heartbeat:
            self.send("worker-offline")


def _loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not available on this platform
        return [0.0, 0.0, 0.0]
