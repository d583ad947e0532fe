"""The prefork pool under faults: real children, real signals, real kills."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest

from celeriac import Celeriac, TimeLimitExceeded, WorkerLostError
from celeriac.testing import WorkerProcess, wait_until
from tests.integration import app_tasks as t

pytestmark = pytest.mark.slow


def children_of(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return []
    return [int(p) for p in text.split()]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def test_kill_9_of_a_child_mid_task_redelivers(
        app: Celeriac, tmp_path: Path, start_worker: Callable[..., WorkerProcess]) -> None:
    w = start_worker("-c", "2")
    marker = tmp_path / "pid"
    r = t.sleep.delay(0.5, str(marker))
    child = int(wait_until(lambda: marker.exists() and marker.read_text(), 10))
    os.kill(child, signal.SIGKILL)
    assert r.get(timeout=15) == 0.5
    w.wait_for_log(rf"{r.id}\] lost: child {child} was killed by signal 9 \(SIGKILL\); "
                   r"redelivering \(delivery 1 of 3\)")
    assert t.add.delay(1, 2).get(timeout=10) == 3  # the pool is back to strength
    wait_until(lambda: len(children_of(w.pid)) == 2, 5)


def test_os_exit_inside_a_task_redelivers(
        app: Celeriac, tmp_path: Path, start_worker: Callable[..., WorkerProcess]) -> None:
    w = start_worker("-c", "1")
    r = t.exit_child.delay(3, str(tmp_path / "once"))
    assert r.get(timeout=15) == "second run"
    w.wait_for_log(r"exited with code 3; redelivering")


def test_poison_task_dead_lettered_after_max_deliveries(
        app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    w = start_worker("-c", "1")
    r = t.exit_child.delay(3)  # kills its child every time
    with pytest.raises(WorkerLostError, match=r"exited with code 3 \(delivery 3 of 3\)"):
        r.get(timeout=20)
    dead = wait_until(app.transport.dead_letters, 5)
    assert dead[0].message.headers["id"] == r.id
    assert t.add.delay(2, 2).get(timeout=10) == 4  # no hot loop, worker fine
    assert w.log.count(f"{r.id}] lost") == 2
    # Each loss waits in the delay store before the next delivery, twice as long as the
    # one before (task_redelivery_delay = 1 s): 1 s, then 2 s.
    times = [_logged_at(line) for line in w.log.splitlines() if r.id in line
             and ("lost" in line or "WorkerLostError" in line)]
    assert len(times) == 3
    assert 1.0 <= times[1] - times[0] < 1.8, times
    assert 2.0 <= times[2] - times[1] < 2.8, times


def _logged_at(line: str) -> float:
    stamp = re.search(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})", line)
    assert stamp, line
    return datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def test_at_most_once_task_fails_at_once_when_its_child_dies(
        app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker("-c", "1")
    r = t.exit_at_most_once.delay(5)
    with pytest.raises(WorkerLostError, match="exited with code 5; acks_late=False"):
        r.get(timeout=10)
    assert app.transport.dead_letters() == []


@pytest.mark.parametrize("task", [t.busy_loop, t.blocking_sleep], ids=["busy-loop", "sleep"])
def test_hard_time_limit_kills_within_1s(
        app: Celeriac, start_worker: Callable[..., WorkerProcess], task: t.Task) -> None:  # type: ignore[name-defined]
    w = start_worker("-c", "1")
    sent = time.monotonic()
    r = task.delay()
    with pytest.raises(TimeLimitExceeded, match=r"hard time limit \(1(\.0)?s\)"):
        r.get(timeout=10)
    assert time.monotonic() - sent < 2.0  # limit 1 s, enforced within 1 s
    assert t.add.delay(1, 1).get(timeout=10) == 2  # the child was replaced
    assert "lost" not in w.log


def test_soft_time_limit_is_raised_inside_the_task(
        app: Celeriac, tmp_path: Path, start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker("-c", "1")
    marker = tmp_path / "cleanup"
    sent = time.monotonic()
    assert t.soft_limited.delay(str(marker)).get(timeout=10) == "cleaned up"
    assert marker.read_text() == "cleaned up"
    assert time.monotonic() - sent < 1.5


def test_global_time_limit_from_the_command_line(
        app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker("-c", "1", "--time-limit", "0.5")
    with pytest.raises(TimeLimitExceeded):
        t.sleep.delay(30).get(timeout=10)


def test_max_tasks_per_child_recycles(
        app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    w = start_worker("-c", "1", "--max-tasks-per-child", "2")
    pids = [t.pid.delay().get(timeout=10) for _ in range(6)]
    assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4] == pids[5]
    assert len(set(pids)) == 3
    assert "recycled" in w.log


def test_max_memory_per_child_recycles_after_the_task(
        app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker("-c", "1", "--max-memory-per-child", str(100 * 1024))  # 100 MiB
    pids = [t.leak.delay(50).get(timeout=20) for _ in range(4)]
    # Each call leaks 50 MB; the child passes 100 MiB after its second task, finishes it,
    # and is replaced: no task is killed for memory.
    assert pids[0] == pids[1] != pids[2] == pids[3]


def test_sigkill_of_the_parent_leaves_no_child_within_2s(
        app: Celeriac, tmp_path: Path, start_worker: Callable[..., WorkerProcess]) -> None:
    w = start_worker("-c", "2")
    marker = tmp_path / "pid"
    t.sleep.delay(30, str(marker))
    wait_until(marker.exists, 10)
    children = children_of(w.pid)
    assert len(children) == 2
    os.kill(w.pid, signal.SIGKILL)  # the parent only, not the group
    killed = time.monotonic()
    wait_until(lambda: not any(alive(c) for c in children), 2.0,
               message="children gone after their parent")
    assert time.monotonic() - killed < 2.0


def test_restart_storm_stops_the_worker_with_a_clear_message(
        app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    w = start_worker("-c", "2", extra_env={"CRASH_CHILD_INIT": "1"}, wait_ready=False)
    assert w.wait(20) == 1
    assert "worker_process_init failed" in w.log
    assert "pool children died 11 times within 10s" in w.log
    assert "stopping the worker instead of restarting them" in w.log


def test_child_that_never_reports_up_is_replaced(
        app: Celeriac, tmp_path: Path, start_worker: Callable[..., WorkerProcess]) -> None:
    hang = tmp_path / "hang"
    w = start_worker("-c", "1", extra_env={"HANG_FIRST_CHILD": str(hang),
                                           "CELERIAC_WORKER_PROC_ALIVE_TIMEOUT": "1"})
    assert t.add.delay(1, 2).get(timeout=10) == 3
    hung = int(hang.read_text())
    w.wait_for_log(rf"child {hung} did not report up within 1.0s; replacing it")
    assert not alive(hung)


def test_autoscale_grows_with_backlog_and_shrinks_when_idle(
        app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    w = start_worker("--autoscale", "3,1",
                     extra_env={"CELERIAC_WORKER_AUTOSCALE_COOLDOWN": "1"})
    wait_until(lambda: len(children_of(w.pid)) == 1, 5)
    results = [t.sleep.delay(1.5) for _ in range(6)]
    wait_until(lambda: len(children_of(w.pid)) == 3, 10, message="grew to 3")
    assert app.backend.wait_for([r.id for r in results], 20).keys() == {r.id for r in results}
    wait_until(lambda: len(children_of(w.pid)) == 1, 15, message="shrank to 1")
    assert "pool grew" in w.log and "pool shrank" in w.log


def test_a_long_task_never_holds_short_ones_back_while_a_child_is_idle(
        app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    """Children hold their next job in their pipe while busy (the lookahead); one held
    behind a long task is recalled as soon as another child is idle."""
    start_worker("-c", "2", extra_env={"CELERIAC_WORKER_PREFETCH_MULTIPLIER": "64"})
    long = t.sleep.delay(5)
    began = time.monotonic()
    short = t.add.delay_many([(i, i) for i in range(100)])
    done = app.backend.wait_for([r.id for r in short], timeout=4.5)
    assert len(done) == 100, f"{100 - len(done)} short tasks waited behind the long one"
    assert time.monotonic() - began < 4.5
    assert not long.ready()  # all of them while the long one still ran
    assert long.get(timeout=10) == 5
