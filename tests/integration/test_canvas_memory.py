"""The canvas on the memory transport and result backend: a worker in a thread of the
test process (the pytest plugin's ``celeriac_worker``), as a user's own tests run it.
Chord counting here is the memory backend's process lock."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from celeriac import Celeriac, ChordError, GroupResult, chain, chord, group


@pytest.fixture
def t(celeriac_app: Celeriac) -> SimpleNamespace:
    app = celeriac_app

    @app.task(name="m.add")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="m.total")
    def total(numbers: list[int]) -> int:
        return sum(numbers)

    @app.task(name="m.boom")
    def boom() -> None:
        raise ValueError("bad value")

    @app.task(name="m.spawn")
    def spawn(n: int) -> int:
        for i in range(n):
            add.delay(i, i)
        return n

    return SimpleNamespace(add=add, total=total, boom=boom, spawn=spawn)


@pytest.fixture
def worker(t: SimpleNamespace, celeriac_worker: Any) -> Any:
    return celeriac_worker  # started after the tasks exist


def test_chain_group_and_chord(t: SimpleNamespace, worker: Any) -> None:
    assert (t.add.s(1, 2) | t.add.s(10)).apply_async().get(timeout=10) == 13
    g = group(t.add.s(i, i) for i in range(10)).apply_async()
    assert g.get(timeout=10) == [2 * i for i in range(10)]
    r = chord(t.add.s(i, i) for i in range(10))(t.total.s())
    assert r.get(timeout=10) == 90 and isinstance(r.parent, GroupResult)


def test_nesting(t: SimpleNamespace, worker: Any) -> None:
    r = chain(t.add.s(1, 1), group(t.add.s(10), t.add.s(20)), t.total.s(),
              t.add.s(1)).apply_async()
    assert r.get(timeout=10) == 35
    workflow = (t.add.s(1, 1)
                | chord([t.add.s(1) | t.add.s(10), t.add.s(2) | t.add.s(20)], t.total.s())
                | t.add.s(100))
    assert workflow.apply_async().get(timeout=10) == 137


def test_errors_propagate(t: SimpleNamespace, worker: Any) -> None:
    r = (t.add.s(1, 1) | t.boom.si() | t.add.s(1)).apply_async()
    with pytest.raises(ValueError, match="bad value"):
        r.get(timeout=10)
    c = chord([t.add.s(1, 1) | t.boom.si() | t.add.s(1), t.add.s(2, 2)], t.total.s())
    with pytest.raises(ChordError, match=r"ValueError\(bad value\)"):
        c.apply_async().get(timeout=10)


def test_children_and_collect(t: SimpleNamespace, worker: Any) -> None:
    r = t.spawn.delay(2)
    assert r.get(timeout=10) == 2
    for child in r.children:
        child.get(timeout=10)
    assert [value for _, value in r.collect(timeout=10)] == [2, 0, 2]
