"""The worker's steps are ordered by the Blueprint: their ``requires`` and the worker's
``STARTS_AFTER`` orderings, whatever order they are listed in."""

from __future__ import annotations

import asyncio
import random
from typing import Any, ClassVar

import pytest

from celeriac.worker import STARTS_AFTER, _steps
from celeriac.worker.autoscale import Autoscaler
from celeriac.worker.blueprint import Blueprint, Step, order
from celeriac.worker.control import ControlStep
from celeriac.worker.gossip import Gossip
from celeriac.worker.health import HealthFile
from celeriac.worker.heart import EventsStep, Heart
from celeriac.worker.mingle import Mingle
from celeriac.worker.revoked import StateDB
from celeriac.worker.steps import ConsumerStep, PoolStep, ResultsCleanup, TimerStep

# The order the worker started its steps in when it listed them by hand.
FULL = [TimerStep, HealthFile, EventsStep, Heart, StateDB, Mingle, ControlStep, PoolStep,
        ConsumerStep, ResultsCleanup, Autoscaler, Gossip]


class First(Step):
    pass


class Second(Step):
    pass


class Needs(Step):
    requires: ClassVar[tuple[type[Step], ...]] = (Second,)


def test_after_orders_without_adding() -> None:
    assert order([First, Second], {First: (Second,)}) == [Second, First]
    assert order([First], {First: (Second,)}) == [First]  # Second is not in it
    # In it as a requirement of another step: ordered too.
    assert order([First, Needs], {First: (Second,)}) == [Second, First, Needs]


def test_after_cycles_are_errors() -> None:
    with pytest.raises(ValueError, match="cycle"):
        order([First, Second], {First: (Second,), Second: (First,)})


@pytest.mark.parametrize("mingle", [True, False])
@pytest.mark.parametrize("autoscale", [True, False])
@pytest.mark.parametrize("gossip", [True, False])
def test_default_steps_start_in_the_order_they_always_did(
        mingle: bool, autoscale: bool, gossip: bool) -> None:
    left_out = {Mingle: mingle, Autoscaler: autoscale, Gossip: gossip}
    expected = [s for s in FULL if left_out.get(s, True)]
    steps = _steps(None, None, mingle=mingle, gossip=gossip, beat=False,  # type: ignore[arg-type]
                   autoscale=autoscale)
    assert order(steps, STARTS_AFTER) == expected


def test_the_orderings_hold_whatever_the_listing() -> None:
    steps = _steps(None, None, mingle=True, gossip=True, beat=False,  # type: ignore[arg-type]
                   autoscale=True)
    rng = random.Random(25)
    for _ in range(200):
        rng.shuffle(steps)
        got = order(steps, STARTS_AFTER)
        assert got[:2] == [TimerStep, HealthFile] and got[-1] is Gossip
        for step, before in STARTS_AFTER.items():
            assert all(got.index(b) < got.index(step) for b in before)
        for step in got:
            assert all(got.index(r) < got.index(step) for r in step.requires)


def test_what_a_step_sets_going_runs_before_the_next_step_starts() -> None:
    # The consumer's first fetch goes out before Gossip's start, which may be CPU work
    # without an await (issue 30: the first task is not held behind later steps).
    seen: list[str] = []

    class Pump(Step):
        async def start(self) -> None:
            self.task = asyncio.get_running_loop().create_task(self.fetch())

        async def fetch(self) -> None:
            seen.append("fetch")

    class Busy(Step):
        requires: ClassVar[tuple[type[Step], ...]] = (Pump,)

        async def start(self) -> None:
            seen.append("busy")

    class Host:
        steps: dict[type[Step], Step] = {}

    async def run() -> None:
        blueprint = Blueprint([Busy])
        await blueprint.start(Host())  # type: ignore[arg-type]
        await blueprint.stop()

    asyncio.run(run())
    assert seen == ["fetch", "busy"]


def test_a_step_that_fails_after_a_turn_still_rolls_back_in_reverse() -> None:
    stopped: list[str] = []

    class Named(Step):
        async def stop(self) -> None:
            stopped.append(self.name)

    class A(Named):
        pass

    class B(Named):
        requires: ClassVar[tuple[type[Step], ...]] = (A,)

    class Fails(Named):
        requires: ClassVar[tuple[type[Step], ...]] = (B,)

        async def start(self) -> None:
            raise RuntimeError("no")

    class Host:
        steps: dict[type[Step], Any] = {}

    with pytest.raises(RuntimeError):
        asyncio.run(Blueprint([Fails]).start(Host()))  # type: ignore[arg-type]
    assert stopped == ["B", "A"]
