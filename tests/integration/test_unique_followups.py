"""Unique jobs as workflow steps (issue 29), with a real worker (prefork, 4 children) on
each shared store (Redis; PostgreSQL results with a Redis broker; SQLite): a chain's
step sent by the worker, a chord header's member sent by the producer. A step whose
unique lock another job holds is sent as a stand-in under its own id, which ends with
the holder's result (or its exception) and the workflow goes on; a holder gone without
a result lets the step run itself. One worker per store for the module; the messages a
producer sends, on the memory broker."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celeriac import Celeriac, chord, group, states
from celeriac.hooks import Hooks
from celeriac.producer.flow import CONCURRENCY_HEADER, UNIQUE_HEADER, WAIT_TASK
from celeriac.testing import WorkerProcess, wait_until
from tests.integration import unique_followups_tasks as ut
from tests.integration.flow_stores import STORES, store_env
from tests.integration.support import bound, workers

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=STORES)
def env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[dict[str, str]]:
    # The stand-in polls every result_chord_retry_interval: short, for a short test.
    with store_env(request.param, "uqf", tmp_path_factory.mktemp("db"),
                   RESULT_CHORD_RETRY_INTERVAL=0.1) as e:
        yield e


@pytest.fixture(scope="module")
def app(env: dict[str, str]) -> Iterator[Celeriac]:
    with bound(ut.app, env) as a:
        yield a


@pytest.fixture(scope="module")
def worker(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[WorkerProcess]:
    with workers("tests.integration.unique_followups_tasks", env,
                 tmp_path_factory.mktemp("w")) as w:
        yield w.start("-c", "4")


def ran(marker_dir: Path) -> set[str]:
    """The ids of the unique tasks that ran."""
    return {p.name for p in marker_dir.iterdir()} - {ut.GATE}


def open_gate(marker_dir: Path) -> None:
    """Let the unique tasks running in ``marker_dir`` end."""
    (marker_dir / ut.GATE).touch()


def waiting(app: Celeriac, step_id: str) -> None:
    """Wait until the step's stand-in waits (its state RETRY: it polls the holder)."""
    wait_until(lambda: app.AsyncResult(step_id).state == states.RETRY, 20,
               message=f"the stand-in of {step_id} waits")


def test_a_chain_step_sent_by_the_worker_takes_the_lock(
        app: Celeriac, worker: WorkerProcess, tmp_path: Path) -> None:
    key = uuid.uuid4().hex
    c = (ut.first.s() | ut.once.si(str(tmp_path), key, 30) | ut.collect.s()).apply_async()
    step = c.parent
    assert step is not None
    wait_until(lambda: ran(tmp_path), 20, message="the step started")
    # The step holds the lock: a delay() meanwhile is that job.
    assert ut.once.delay(str(tmp_path), key, 0.0).id == step.id
    open_gate(tmp_path)
    assert c.get(timeout=30) == f"{key}:{step.id}"
    assert ran(tmp_path) == {step.id}


def test_a_chain_step_waits_for_the_holder_and_goes_on_with_its_result(
        app: Celeriac, worker: WorkerProcess, tmp_path: Path) -> None:
    key = uuid.uuid4().hex
    holder = ut.once.delay(str(tmp_path), key, 30)
    c = (ut.first.s() | ut.once.si(str(tmp_path), key, 0.0) | ut.collect.s()).apply_async()
    step = c.parent
    assert step is not None
    waiting(app, step.id)
    open_gate(tmp_path)
    assert c.get(timeout=30) == f"{key}:{holder.id}"
    assert step.get(timeout=5) == f"{key}:{holder.id}"  # the step's own id resolves
    assert ran(tmp_path) == {holder.id}  # the work ran once


def test_a_chord_header_member_sent_by_the_producer_waits_for_the_holder(
        app: Celeriac, worker: WorkerProcess, tmp_path: Path) -> None:
    key = uuid.uuid4().hex
    holder = ut.once.delay(str(tmp_path), key, 30)
    result = chord([ut.once.si(str(tmp_path), key, 0.0), ut.first.si()],
                   ut.collect.s()).apply_async()
    assert result.parent is not None
    waiting(app, result.parent.results[0].id)
    open_gate(tmp_path)
    assert result.get(timeout=30) == [f"{key}:{holder.id}", "first"]
    assert ran(tmp_path) == {holder.id}


def test_a_failed_holder_fails_the_step_and_the_rest_of_its_chain(
        app: Celeriac, worker: WorkerProcess, tmp_path: Path) -> None:
    key = uuid.uuid4().hex
    holder = ut.once.delay(str(tmp_path), key, 30, True)
    c = (ut.first.s() | ut.once.si(str(tmp_path), key, 0.0) | ut.collect.s()).apply_async()
    assert c.parent is not None
    waiting(app, c.parent.id)
    open_gate(tmp_path)
    with pytest.raises(ValueError, match=f"{key} failed"):
        c.get(timeout=30)
    assert ran(tmp_path) == {holder.id}


def test_a_holder_gone_without_a_result_lets_the_step_run_itself(
        app: Celeriac, worker: WorkerProcess, tmp_path: Path) -> None:
    key = uuid.uuid4().hex
    holder = ut.quiet.delay(str(tmp_path), key, 30)  # stores no result
    c = (ut.first.s() | ut.quiet.si(str(tmp_path), key, 0.0) | ut.collect.s()).apply_async()
    step = c.parent
    assert step is not None
    # Its stand-in stores nothing either (ignore_result): the worker's log says it waits.
    wait_until(lambda: f"[{step.id}]: {holder.id} holds its unique lock" in worker.log, 20,
               message="the stand-in waits")
    open_gate(tmp_path)
    assert c.get(timeout=30) == f"{key}:{step.id}"
    assert ran(tmp_path) == {holder.id, step.id}


def _published(app: Celeriac) -> list[dict[str, Any]]:
    """The headers of every message ``app`` publishes from now on."""
    seen: list[dict[str, Any]] = []

    def before_publish(self: Any, message: Any, queue: str) -> None:
        seen.append(dict(message.headers))

    app.add_hooks(type("Spy", (Hooks,), {"before_publish": before_publish})())
    return seen


def test_a_send_that_carries_a_workflow_gets_a_stand_in_a_plain_one_the_holder(
        memory_app: Celeriac) -> None:
    @memory_app.task(name="uq.once", unique_for=30)
    def once(x: int) -> int:
        return x

    seen = _published(memory_app)
    holder = once.delay(1)
    assert once.delay(1).id == holder.id  # a plain send: the holder's result, as before
    linked = once.apply_async((1,), link=once.si(2))  # its callback waits for its id
    member = group([once.si(1), once.si(3)]).apply_async().results[0]
    assert holder.id not in (linked.id, member.id)
    waiting = [h for h in seen if h["task"] == WAIT_TASK]
    assert [h["id"] for h in waiting] == [linked.id, member.id]
    assert all(UNIQUE_HEADER not in h for h in waiting)
    assert [h["task"] for h in seen] == ["uq.once", WAIT_TASK, WAIT_TASK, "uq.once"]


def test_a_step_gets_its_concurrency_key_and_a_debounced_one_is_sent_undebounced(
        memory_app: Celeriac) -> None:
    @memory_app.task(name="uq.deb", unique_for=30, unique_mode="debounce")
    def deb(x: int) -> int:
        return x

    @memory_app.task(name="uq.tenant", concurrency=2, concurrency_key=lambda a, k: a[0])
    def tenant(t: str) -> str:
        return t

    seen = _published(memory_app)
    group([deb.si(1), deb.si(1), tenant.si("t1")]).apply_async()
    assert [h["task"] for h in seen] == ["uq.deb", "uq.deb", "uq.tenant"]
    assert all(UNIQUE_HEADER not in h and h["eta"] is None for h in seen[:2])
    assert seen[2][CONCURRENCY_HEADER] == "t1"
