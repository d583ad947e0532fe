"""``update_state`` in a real worker on Redis, as an ``EventReceiver`` sees it: with
``-E`` each report becomes a ``task-progress`` event from the worker's main process, in
order and before ``task-succeeded`` (a tight loop throttled to a few); without ``-E`` the
task is not registered for reports (so no PROGRESS frame can be written) and no event
is sent."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from celeriac import Celeriac
from celeriac.runtime.progress import INTERVAL
from celeriac.testing import WorkerProcess, wait_until
from tests.integration import progress_tasks as pt
from tests.integration.support import bound, redis_env, workers
from tests.integration.test_task_events import Collector

pytestmark = pytest.mark.slow



@pytest.fixture
def env() -> Iterator[dict[str, str]]:
    with redis_env("pg", worker_lease_timeout=2.0) as e:
        yield e


@pytest.fixture
def app(env: dict[str, str]) -> Iterator[Celeriac]:
    with bound(pt.app, env) as a:
        yield a


@pytest.fixture
def collect(app: Celeriac) -> Iterator[Collector]:
    with Collector(app) as collector:
        yield collector


@pytest.fixture
def start_worker(env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    with workers("tests.integration.progress_tasks", env, tmp_path) as pool:
        yield pool.start


@pytest.mark.parametrize(("pool", "task"), [
    ("prefork", "steps"), ("solo", "steps"), ("threads", "steps"), ("prefork", "asteps")])
def test_progress_events_in_order_before_the_final_one(
        app: Celeriac, collect: Collector, start_worker: Callable[..., WorkerProcess],
        pool: str, task: str) -> None:
    w = start_worker("-E", "-P", pool, "-c", "2")
    r = getattr(pt, task).delay(3, 0.15, 300)
    got = r.get(timeout=20)
    assert got["registered"] is True
    events = collect.lifecycle(r.id)
    with collect._lock:
        arrival = [e["clock"] for e in collect.by_task[r.id]]
    assert arrival == sorted(arrival)  # one dispatcher: received in the order sent
    types = [e["type"] for e in events]
    assert types[:2] == ["task-received", "task-started"]
    assert types[-1] == "task-succeeded"
    progress = events[2:-1]
    assert {e["type"] for e in progress} == {"task-progress"}
    # The spaced reports each go at once; the burst of 300 is throttled to a few (about
    # one per interval it lasted), the last of them among those sent.
    assert [(e["state"], e["meta"]) for e in progress[:3]] == [
        ("PROGRESS", {"done": i, "total": 3}) for i in (1, 2, 3)]
    assert progress[-1]["state"] == "CRUNCHING"
    assert progress[-1]["meta"] == {"current": 300, "total": 300}
    most = 5 + int(got["burst_s"] / INTERVAL)
    assert 4 <= len(progress) <= 3 + most, [e["meta"] for e in progress]
    main_pid = w.pid
    for e in progress:
        assert e["uuid"] == r.id and e["hostname"] == events[0]["hostname"]
        assert e["pid"] == main_pid  # from the worker's main process, not a child
        assert isinstance(e["timestamp"], float) and isinstance(e["clock"], int)


def test_no_progress_without_dash_e(app: Celeriac, collect: Collector,
                                    start_worker: Callable[..., WorkerProcess]) -> None:
    w = start_worker("-P", "prefork", "-c", "1")
    r = pt.steps.delay(2, 0.0, 50)
    # Not registered: update_state in the child had no reporter to write a frame with.
    assert r.get(timeout=20)["registered"] is False
    assert app.backend.get(r.id) is not None
    w.stop()
    # worker-offline is its last event: whatever it sent before has arrived by then.
    wait_until(lambda: "worker-offline" in collect.types, 10, message="worker-offline")
    with collect._lock:
        assert not collect.by_task, collect.by_task
        assert "task-progress" not in collect.types
