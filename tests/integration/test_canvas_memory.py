"""The canvas on the memory transport and result backend: a worker in a thread of the
test process (the pytest plugin's ``celeriac_worker``), as a user's own tests run it.
Chord counting here is the memory backend's process lock."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from celeriac import Celeriac, ChordError, GroupResult, chain, chord, group
from celeriac.canvas import StampingVisitor


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

    @app.task(name="m.identity")
    def identity(x: Any) -> Any:
        return x

    @app.task(name="m.stamps", bind=True)
    def stamps(self: Any, *args: Any) -> dict[str, Any]:
        """The stamps this task's message carried, as Celery's request shows them."""
        return dict(self.request.stamps)

    return SimpleNamespace(add=add, total=total, boom=boom, spawn=spawn, stamps=stamps,
                           identity=identity)


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
    result = c.apply_async()
    # The failing header task's own exception (Celery's get() follows the parents); the
    # body's own outcome is the ChordError naming it.
    with pytest.raises(ValueError, match="bad value"):
        result.get(timeout=10)
    with pytest.raises(ChordError, match=r"ValueError\(bad value\)"):
        result.get(timeout=10, follow_parents=False)


def test_children_and_collect(t: SimpleNamespace, worker: Any) -> None:
    r = t.spawn.delay(2)
    assert r.get(timeout=10) == 2
    for child in r.children:
        child.get(timeout=10)
    assert [value for _, value in r.collect(timeout=10)] == [2, 0, 2]


class _Monitor(StampingVisitor):
    def on_signature(self, sig: Any, **headers: Any) -> dict[str, Any]:
        return {"monitoring_id": "m-1"}


def test_stamps_reach_the_worker_and_its_follow_ups(t: SimpleNamespace, worker: Any
                                                     ) -> None:
    sig = t.stamps.si()
    sig.stamp(_Monitor())
    assert sig.apply_async().get(timeout=10) == {"monitoring_id": "m-1"}
    workflow = chain(t.add.si(1, 1), t.stamps.s())  # the second step sent by the worker
    workflow.stamp(_Monitor())
    assert workflow.apply_async().get(timeout=10) == {"monitoring_id": "m-1"}
    c = chord([t.add.s(1, 1), t.add.s(2, 2)], t.stamps.s())  # the body, sent by a worker
    c.stamp(_Monitor())
    assert c.apply_async().get(timeout=10) == {"monitoring_id": "m-1"}


def test_nesting_celery_supports(t: SimpleNamespace, worker: Any) -> None:
    # A chord as a group member, and a chord in a chord's header.
    assert group(chord([t.add.s(1, 1), t.add.s(2, 2)], t.total.s()),
                 t.add.s(5, 5)).apply_async().get(timeout=10) == [6, 10]
    assert chord([chord([t.add.s(1, 1), t.add.s(2, 2)], t.total.s()), t.add.s(3, 3)],
                 t.total.s()).apply_async().get(timeout=10) == 12
    # A chain ending in a group, as a group member and in a chord's header: one list.
    assert group(t.add.si(1, 1), chain(t.add.si(5, 5), group(t.add.s(1), t.add.s(2)))
                 ).apply_async().get(timeout=10) == [2, [11, 12]]
    assert chord([chain(t.add.si(5, 5), group(t.add.s(1), t.add.s(2))), t.add.si(1, 1)],
                 t.identity.s()).apply_async().get(timeout=10) == [[11, 12], 2]
    # A chain ending in a chord in a chord's header; a group after a group in a chain.
    inner = chain(t.add.si(1, 1), chord([t.add.s(1), t.add.s(2)], t.total.s()))
    assert chord([inner, t.add.si(0, 1)], t.total.s()).apply_async().get(timeout=10) == 8
    grouped = chain(t.add.si(1, 1), group(t.add.s(1), t.add.s(2)),
                    group(t.total.s(), t.total.s()), t.total.s())
    assert grouped.apply_async().get(timeout=10) == 14
