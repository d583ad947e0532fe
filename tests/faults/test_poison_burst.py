"""A burst of poison messages (tasks that ``os._exit``) must not stop the worker.

Each of those deaths kills a child that was running a task, and counts against that
task's message (redelivered, then dead-lettered after ``task_max_deliveries``); the
restart-storm guard counts only children that die with nothing running (a broken
``worker_process_init``, a child that dies idle). Real workers on Redis, real
``os._exit``, real SIGKILLs.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from celeriac import Celeriac
from celeriac.testing import wait_until
from tests.integration import app_tasks as t
from tests.integration import async_app_tasks as at
from tests.integration.support import Workers, bound, redis_env, workers

pytestmark = pytest.mark.slow


@pytest.fixture
def env() -> Iterator[dict[str, str]]:
    with redis_env("poison", WORKER_LEASE_TIMEOUT=2.0) as e:
        yield e


@pytest.fixture
def app(env: dict[str, str]) -> Iterator[Celeriac]:
    with bound(t.app, env) as a:
        yield a


@pytest.fixture
def pool(env: dict[str, str], tmp_path: Path) -> Iterator[Workers]:
    with workers("tests.integration.async_app_tasks", env, tmp_path) as w:
        yield w


def dead_ids(app: Celeriac) -> set[str]:
    return {d.message.headers.get("id") for d in app.transport.dead_letters(1000)}


def test_burst_of_20_poison_messages_is_dead_lettered_and_the_worker_stays_up(
        app: Celeriac, pool: Workers) -> None:
    w = pool.start("-c", "2")
    sent = time.monotonic()
    poison = t.exit_child.delay_many([(1,)] * 20)
    ids = {r.id for r in poison}

    def all_dead() -> bool:
        assert w.proc is not None and w.proc.poll() is None, f"the worker stopped:\n{w.log}"
        return dead_ids(app) >= ids

    # 60 deaths (3 deliveries each), spaced by the redelivery backoff (1 s, then 2 s).
    wait_until(all_dead, 60, interval=0.1, message="all 20 dead-lettered")
    print(f"\n20 poison messages dead-lettered {time.monotonic() - sent:.1f}s after the "
          "send")
    assert w.proc is not None and w.proc.poll() is None, w.log
    assert t.add.delay(2, 3).get(timeout=15) == 5
    assert "pool children died" not in w.log
    assert w.log.count("exited with code 1 (delivery 3 of 3)") == 20
    assert w.stop() == 0, w.log


def test_storm_guard_counts_only_children_that_die_with_nothing_running(
        app: Celeriac, pool: Workers, tmp_path: Path) -> None:
    """With ``worker_max_restarts=0`` one counted death stops the worker: a child killed
    mid sync task or with async tasks in flight is not counted; an idle one is."""
    w = pool.start("-c", "1", extra_env={"CELERIAC_WORKER_MAX_RESTARTS": "0",
                                         "CELERIAC_TASK_REDELIVERY_DELAY": "0.05"})
    # A sync task that kills its child (once: it succeeds when redelivered).
    r = t.exit_child.delay(3, str(tmp_path / "once"))
    assert r.get(timeout=15) == "second run"
    w.wait_for_log(rf"{r.id}\] lost: child \d+ exited with code 3; redelivering")

    # A child killed with async tasks in flight: they are redelivered and run again.
    marks = tmp_path / "async"
    marks.mkdir()
    naps = [at.anap.delay(5.0, str(marks)) for _ in range(5)]
    files = wait_until(lambda: len(list(marks.iterdir())) >= 5 and list(marks.iterdir()), 15)
    second = int(files[0].name.split("-")[0])
    os.kill(second, signal.SIGKILL)
    assert second not in {n.get(timeout=30) for n in naps}
    assert f"lost: child {second} was killed by signal 9" in w.log
    assert w.proc is not None and w.proc.poll() is None, w.log

    # The replacement runs a task, then dies idle: that one counts, and is one too many.
    idle = tmp_path / "idle"
    assert t.sleep.delay(0, str(idle)).get(timeout=15) == 0
    # On an idle worker the child stores the result and acks before it reports DONE:
    # wait for that report, so that the child is idle in the worker's books.
    wait_until(lambda: (a := app.control.inspect(timeout=1).active()) and not any(a.values()),
               15)
    third = int(idle.read_text())
    os.kill(third, signal.SIGKILL)
    assert w.wait(15) == 1
    assert ("pool children died 1 times within 10s with no task running (last: child "
            f"{third} was killed by signal 9 (SIGKILL))") in w.log
