"""Gossip between real worker processes on Redis: two workers see each other join and
leave (one log line each), exactly one wins the election "singleton", and when it is
killed with ``kill -9`` the other takes over once the lease runs out. And the health
probe: green while a worker runs a long task (its loop is free), red once it is killed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from celeriac import Celeriac
from celeriac.testing import WorkerProcess, wait_until
from tests.integration import cluster_tasks as t
from tests.integration.support import ROOT, bound, redis_env, workers

pytestmark = pytest.mark.slow

HEARTBEAT = 0.5
"""Seconds between heartbeats: a silent worker leaves after 1 s, a lease lasts 1 s."""


@pytest.fixture
def env() -> Iterator[dict[str, str]]:
    with redis_env("cl", worker_lease_timeout=2.0, worker_heartbeat_interval=HEARTBEAT,
                   worker_health_interval=0.2) as e:
        yield e


@pytest.fixture
def app(env: dict[str, str]) -> Iterator[Celeriac]:
    with bound(t.app, env) as a:
        yield a


@pytest.fixture
def start_worker(env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    with workers("tests.integration.cluster_tasks", env, tmp_path, "-c", "1") as pool:
        yield lambda name, *args, wait_ready=True: pool.start(
            "-n", f"{name}@%h", *args, wait_ready=wait_ready)


def test_two_workers_see_each_other_join_and_leave(
        start_worker: Callable[..., WorkerProcess]) -> None:
    a = start_worker("a")
    b = start_worker("b")
    a.wait_for_log(r"b@\S+ joined \(1 other", 10)
    b.wait_for_log(r"a@\S+ joined \(1 other", 10)
    assert b.stop() == 0
    a.wait_for_log(r"b@\S+ left \(offline", 10)
    c = start_worker("c")
    a.wait_for_log(r"c@\S+ joined", 10)
    c.kill()  # kill -9: no worker-offline; its heartbeats stop
    match = a.wait_for_log(r"c@\S+ left \(no heartbeat for ([\d.]+)s", 10)
    assert 2 * HEARTBEAT <= float(match.group(1)) <= 2 * HEARTBEAT + 1.5
    assert len(re.findall(r"b@\S+ joined", a.log)) == 1  # one line per join


def test_one_worker_wins_the_election_and_the_other_takes_over_after_kill_9(
        start_worker: Callable[..., WorkerProcess]) -> None:
    a, b = start_worker("a"), start_worker("b")
    won = r"won election 'singleton'"
    leader = wait_until(lambda: next((w for w in (a, b) if re.search(won, w.log)), None),
                        10, message="a leader")
    other = b if leader is a else a
    # Through several renewals the leader keeps the lease and the other waits.
    watch_until = time.monotonic() + 4 * HEARTBEAT
    while time.monotonic() < watch_until:
        assert won not in other.log and "lost election" not in leader.log
        time.sleep(0.05)  # sleep-ok: poll interval, bounded by the deadline
    killed = time.monotonic()
    leader.signal(signal.SIGKILL)
    other.wait_for_log(won, 10)
    took = time.monotonic() - killed
    print(f"take-over {took:.2f}s after kill -9 (lease {2 * HEARTBEAT}s)")
    assert took <= 2 * HEARTBEAT + 2.0


def health(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "celeriac", "health", "--health-file",
                           str(path), "--max-age", "1.5"], capture_output=True, text=True,
                          timeout=30, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_health_is_green_during_a_long_task_and_red_after_kill_9(
        app: Celeriac, start_worker: Callable[..., WorkerProcess], tmp_path: Path) -> None:
    path = tmp_path / "w.health"
    w = start_worker("w", "--health-file", str(path), "--without-gossip")
    # Longer than the checks by far: each probe is a new Python process, slow on a
    # loaded machine, and every one must run while the task does.
    result = t.nap.delay(10.0)
    wait_until(lambda: result.state == "STARTED", 10)
    checks = 0
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline and result.state != "SUCCESS":
        probe = health(path)
        assert probe.returncode == 0, probe.stderr
        checks += 1
    assert checks >= 2 and result.state != "SUCCESS"  # all while the task was running
    w.signal(signal.SIGKILL)
    probe = wait_until(lambda: (p := health(path)).returncode == 1 and p, 10)
    assert "is not running" in probe.stderr
