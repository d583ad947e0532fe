"""``async def`` tasks through real workers: prefork children's loops and the threads pool,
mixed with sync tasks, canvas, retries, limits, a child killed with 50 in flight."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from celeriac import Celeriac, chain
from celeriac.testing import WorkerProcess, wait_until
from tests.integration import async_app_tasks as at

pytestmark = pytest.mark.slow


@pytest.fixture
def start_worker(env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(*args: str) -> WorkerProcess:
        w = WorkerProcess("tests.integration.async_app_tasks", *args, env=env,
                          cwd=str(tmp_path))
        started.append(w)
        return w.start()

    yield start
    for w in started:
        w.kill()


def test_prefork_runs_async_and_sync_tasks_side_by_side(
        app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    w = start_worker("-c", "2", "--child-concurrency", "30")
    began = time.monotonic()
    naps = [at.anap.delay(1.0) for _ in range(60)]
    adds = [at.add.delay(i, i) for i in range(10)]
    flow = chain(at.adouble.s(2), at.add.s(3), at.adouble.s()).delay()
    flaky = at.aflaky.delay(7)
    soft = at.asoft.delay()
    assert [r.get(timeout=10) for r in adds] == [2 * i for i in range(10)]
    pids = [r.get(timeout=10) for r in naps]
    assert time.monotonic() - began < 4.0  # 60 x 1 s in 2 processes: at once
    assert len(set(pids)) == 2
    assert flow.get(timeout=10) == 14 and flow.parent is not None
    assert flaky.get(timeout=10) == [7, 2]  # self.retry from a bound async task
    assert soft.get(timeout=10) == "cleaned up"
    blocked = at.ablock.delay(0.4)
    assert blocked.get(timeout=10) == "blocked"
    # The loop's lag is reported with the task that held it, once for the episode.
    w.wait_for_log(rf"blocked for more than 0\.10s by Task [\w.]+ablock\[{blocked.id}\]")
    assert w.log.count(f"ablock[{blocked.id}]: blocking code") == 1


def test_kill_9_of_a_child_with_50_async_tasks_in_flight_loses_none(
        app: Celeriac, tmp_path: Path, start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker("-c", "1", "--child-concurrency", "60")
    marks = tmp_path / "started"
    marks.mkdir()
    results = [at.anap.delay(1.5, str(marks)) for _ in range(50)]
    files = wait_until(lambda: len(list(marks.iterdir())) == 50 and list(marks.iterdir()), 10)
    child = int(files[0].name.split("-")[0])
    os.kill(child, signal.SIGKILL)
    pids = [r.get(timeout=20) for r in results]  # every one redelivered and run again
    assert child not in pids and len(set(pids)) == 1


def test_threads_pool_runs_sync_and_async_tasks_and_warns_of_hard_limits(
        app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    w = start_worker("-P", "threads", "-c", "4", "--time-limit", "30")
    w.wait_for_log(r"the threads pool cannot enforce hard time limits \(task_time_limit\)")
    began = time.monotonic()
    naps = [at.anap.delay(0.5) for _ in range(50)]
    adds = [at.add.delay(i, 1) for i in range(20)]
    assert [r.get(timeout=10) for r in adds] == [i + 1 for i in range(20)]
    assert {r.get(timeout=10) for r in naps} == {w.pid}  # in the worker's own process
    assert time.monotonic() - began < 3.0
    assert at.soft_thread.delay().get(timeout=10) == "cleaned up"
    assert at.asoft.delay().get(timeout=10) == "cleaned up"
    assert at.aflaky.delay(3).get(timeout=10) == [3, 2]


def test_warm_stop_lets_async_tasks_in_flight_finish_and_a_cold_one_gives_them_back(
        app: Celeriac, tmp_path: Path, start_worker: Callable[..., WorkerProcess]) -> None:
    w = start_worker("-c", "2", "--child-concurrency", "20")
    marks = tmp_path / "warm"
    marks.mkdir()
    results = [at.anap.delay(1.0, str(marks)) for _ in range(20)]
    wait_until(lambda: len(list(marks.iterdir())) == 20, 10)
    w.signal(signal.SIGTERM)
    assert w.wait(15) == 0
    assert all(r.state == "SUCCESS" for r in results)  # finished before the exit
    w.wait_for_log(r"warm shutdown: 20 task\(s\) running")

    w2 = start_worker("-c", "1", "--child-concurrency", "20")
    cold = tmp_path / "cold"
    cold.mkdir()
    results = [at.anap.delay(5.0, str(cold)) for _ in range(10)]
    wait_until(lambda: len(list(cold.iterdir())) == 10, 10)
    w2.signal(signal.SIGQUIT)
    assert w2.wait(10) == 0
    assert not any(r.ready() for r in results)
    start_worker("-c", "1", "--child-concurrency", "20")  # they were given back: run here
    assert len({r.get(timeout=20) for r in results}) == 1
