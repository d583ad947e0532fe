"""Celery's call shapes where its integration suite found celeriac differing: stamps
given to ``apply_async``/``retry`` as options, results compared with ids, a chain's own
links kept where it is spliced into another, a task returning a result. On the memory
transport, with a worker in a thread of this process where a task must run."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from celeriac import AsyncResult, Celeriac, GroupResult, chain, chord, group
from celeriac.protocol import Message


def make_app() -> Celeriac:
    url = f"memory://{uuid.uuid4().hex}"
    return Celeriac(f"c{uuid.uuid4().hex[:6]}", broker=url, backend=url)


@pytest.fixture
def app() -> Iterator[Celeriac]:
    a = make_app()
    yield a
    a.close()


def sent(app: Celeriac) -> list[Message]:
    async def take() -> list[Message]:
        t = app.transport
        await t.connect("probe")
        got = await t.fetch(["celery"], 100, 0.05)
        await t.ack(got)
        return [d.message for d in got]

    return asyncio.run(take())


def test_apply_async_takes_stamps_as_options(app: Celeriac) -> None:
    @app.task(name="c.echo")
    def echo(x: Any) -> Any:
        return x

    echo.apply_async((1,), stamped_headers=["mon"], mon="abc", headers={"h": 1})
    (message,) = sent(app)
    assert message.headers["stamped_headers"] == ["mon"]
    assert message.headers["stamps"] == {"mon": "abc"}
    assert message.headers["h"] == 1 and "mon" not in message.headers


def test_a_result_equals_its_id_as_celerys() -> None:
    app = make_app()
    r = AsyncResult("a1", app)
    g = GroupResult("g1", [r], app)
    assert r == "a1" and r != "a2" and "a1" in g.results
    assert g == "g1" and {r: 1}["a1"] == 1
    app.close()


def test_a_spliced_chain_keeps_its_links(app: Celeriac) -> None:
    @app.task(name="c.add")
    def add(x: str, y: str) -> str:
        return x + y

    inner = chain(add.s("a", "b"), add.s("c"))
    inner.link(add.si("link", "!"))
    inner.link_error(add.si("err", "!"))
    for outer in (chain(inner, add.s("d")), inner | add.s("d"), add.s("x", "y") | inner):
        steps = outer._steps(None, None)
        names = [[(s.args, [tuple(e.args) for e in s.options.get(k) or ()])
                  for k in ("link", "link_error")] for s in steps]
        spliced = [n for n, s in zip(names, steps, strict=True) if s.args[-1] in ("b", "c")]
        assert [n[1][1] for n in spliced] == [[("err", "!")], [("err", "!")]]
        assert spliced[-1][0][1] == [("link", "!")] and spliced[0][0][1] == []


@pytest.fixture
def t(celeriac_app: Celeriac) -> SimpleNamespace:
    app = celeriac_app
    tries: list[dict[str, Any]] = []

    @app.task(name="c.add")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="c.echo")
    def echo(x: Any) -> Any:
        return x

    @app.task(name="c.spawn")
    def spawn() -> Any:
        return (add.s(1, 1) | group(add.s(1), add.s(2)) | add.si(5, 5)).delay()

    @app.task(name="c.flaky", bind=True, max_retries=2, default_retry_delay=0)
    def flaky(self: Any) -> dict[str, Any]:
        tries.append(dict(self.request.stamps or {}))
        if self.request.retries == 0:
            raise self.retry()
        if self.request.retries == 1:
            raise self.retry(stamped_headers=["again"], again="yes")
        return dict(self.request.stamps)

    return SimpleNamespace(add=add, echo=echo, spawn=spawn, flaky=flaky, tries=tries)


def test_a_task_returning_a_result_stores_its_tuple(t: SimpleNamespace,
                                                    celeriac_worker: Any) -> None:
    value = t.spawn.delay().get(timeout=20)
    (last_id, parent), children = value  # Celery's as_tuple: ((id, parent), None)
    assert children is None and isinstance(last_id, str)
    assert isinstance(parent, list)  # the chord's header (a group) above it
    assert AsyncResult(last_id, t.add.app).get(timeout=20) == 10


def test_retry_sends_the_stamps_again_and_takes_new_ones(t: SimpleNamespace,
                                                         celeriac_worker: Any) -> None:
    sig = t.flaky.s()
    sig.stamp(mon="m1")
    # The retry's own stamps replace the call's (Celery's signature_from_request).
    assert sig.delay().get(timeout=20) == {"again": "yes"}
    assert t.tries[:2] == [{"mon": "m1"}, {"mon": "m1"}]


def test_a_group_of_one_chain_ending_in_a_group_is_that_chain(t: SimpleNamespace,
                                                              celeriac_worker: Any) -> None:
    res = group(t.add.s(1, 2) | group(t.add.s(1), t.add.s(2)))()
    assert isinstance(res, GroupResult)
    assert res.get(timeout=20) == [4, 5]  # Celery's special case: not [[4, 5]]
    # In a chord's header it stays one member whose value is the list (Celery's too).
    header = group(t.add.s(1, 2) | group(t.add.s(1), t.add.s(2)))
    assert chord(header, t.echo.s()).delay().get(timeout=20) == [[4, 5]]
