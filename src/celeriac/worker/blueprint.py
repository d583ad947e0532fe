"""Blueprint of Steps: the worker's parts, started in dependency order.

A ``Step`` names the steps it needs in ``requires``; the blueprint adds those it was not
given, sorts them so every step starts after what it requires, starts them in that
order and stops them in reverse. ``after`` orders without requiring: a step starts after
those it names there that are in the blueprint (the worker's orderings between steps
that work without each other). If a step fails to start, the ones already started are
stopped (in reverse) before the error propagates.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from . import Worker

logger = logging.getLogger("celeriac.worker.blueprint")


class Step:
    requires: ClassVar[tuple[type[Step], ...]] = ()

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    @property
    def name(self) -> str:
        return type(self).__name__

    async def start(self) -> None:
        """Bring the step up; the steps it requires are already running."""

    async def stop(self) -> None:
        """Warm stop: finish what is in hand. Steps that require this one are stopped."""

    async def terminate(self) -> None:
        """Cold stop: give work back and stop now. Defaults to ``stop``."""
        await self.stop()


Ordering = Mapping[type[Step], Iterable[type[Step]]]
"""Step -> the steps it starts after, when they are in the blueprint."""


def order(steps: Iterable[type[Step]], after: Ordering | None = None) -> list[type[Step]]:
    """Topological order of ``steps`` and everything they require, each also after what
    ``after`` names for it among those; stable for ties."""
    steps = list(steps)
    present = _with_requirements(steps)
    result: list[type[Step]] = []
    visiting: set[type[Step]] = set()

    def visit(step: type[Step]) -> None:
        if step in result:
            return
        if step in visiting:
            raise ValueError(f"steps require each other in a cycle through {step.__name__}")
        visiting.add(step)
        for dep in step.requires:
            visit(dep)
        for dep in (after or {}).get(step, ()):
            if dep in present:
                visit(dep)
        visiting.discard(step)
        result.append(step)

    for step in steps:
        visit(step)
    return result


def _with_requirements(steps: Iterable[type[Step]]) -> set[type[Step]]:
    """``steps`` and every step they require, directly or not."""
    found: set[type[Step]] = set()
    pending = list(steps)
    while pending:
        step = pending.pop()
        if step not in found:
            found.add(step)
            pending.extend(step.requires)
    return found


class Blueprint:
    def __init__(self, steps: Iterable[type[Step]], after: Ordering | None = None) -> None:
        self.order = order(steps, after)
        self.started: list[Step] = []

    async def start(self, worker: Worker) -> None:
        for cls in self.order:
            step = cls(worker)
            worker.steps[cls] = step
            logger.debug("starting %s", step.name)
            try:
                await step.start()
            except BaseException:
                logger.error("step %s failed to start; stopping the others", step.name)
                await self.stop(cold=True)
                raise
            self.started.append(step)
            # A turn of the loop between steps: what a started step set going (the
            # consumer's first fetch) runs now, not after the next step's start, which
            # may be CPU work without an await (Gossip's, ~10 ms; issue 30).
            await asyncio.sleep(0)

    async def stop(self, cold: bool = False) -> None:
        while self.started:
            # Pop only once stopped: if a warm stop is cancelled midway (a second Ctrl-C),
            # the cold stop that follows still terminates this step.
            step = self.started[-1]
            logger.debug("stopping %s", step.name)
            try:
                await (step.terminate() if cold else step.stop())
            except Exception:
                logger.exception("step %s failed to stop", step.name)
            self.started.pop()
