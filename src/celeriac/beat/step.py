"""``BeatStep``: ``celeriac worker -B``, a beat inside the worker's main process, on the
worker's Timer (not a second process). It starts after the Timer and stops before it;
a stopping worker gives the lease up, so another beat takes over at once."""

from __future__ import annotations

from ..worker.blueprint import Step
from ..worker.steps import TimerStep
from .django import create_beat
from .runner import BeatRunner


class BeatStep(Step):
    requires = (TimerStep,)

    async def start(self) -> None:
        w = self.worker
        self.runner = BeatRunner(create_beat(w.app, hostname=w.hostname), w.timer)
        self.runner.start()

    async def stop(self) -> None:
        await self.runner.stop()
