import asyncio
from typing import Any, ClassVar

import pytest

from celeriac.worker.blueprint import Blueprint, Step, order

events: list[str] = []


class A(Step):
    async def start(self) -> None:
        events.append("start A")

    async def stop(self) -> None:
        events.append("stop A")


class B(Step):
    requires = (A,)

    async def start(self) -> None:
        events.append("start B")

    async def stop(self) -> None:
        events.append("stop B")


class C(Step):
    requires = (B,)

    async def start(self) -> None:
        raise RuntimeError("C cannot start")


class FakeWorker:
    steps: ClassVar[dict[Any, Any]] = {}


def test_order_adds_requirements_and_sorts() -> None:
    assert order([B]) == [A, B]
    assert order([C, A]) == [A, B, C]


def test_cycle_is_an_error() -> None:
    class X(Step):
        pass

    class Y(Step):
        requires = (X,)

    X.requires = (Y,)
    with pytest.raises(ValueError, match="cycle"):
        order([X])


def test_start_in_order_stop_in_reverse() -> None:
    events.clear()
    bp = Blueprint([B])
    asyncio.run(bp.start(FakeWorker()))  # type: ignore[arg-type]
    asyncio.run(bp.stop())
    assert events == ["start A", "start B", "stop B", "stop A"]


def test_failed_start_stops_the_started_ones() -> None:
    events.clear()
    bp = Blueprint([C])
    with pytest.raises(RuntimeError, match="C cannot start"):
        asyncio.run(bp.start(FakeWorker()))  # type: ignore[arg-type]
    assert events == ["start A", "start B", "stop B", "stop A"]
