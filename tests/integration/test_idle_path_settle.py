"""An idle worker's pool child settles its job's message itself (``Job.settle``): it
stores the result and acks the message in one broker call before it reports DONE, so
the caller's ``get()`` does not wait for the worker's main process. Real Redis, a real
prefork worker (this module is its app: ``-A tests.integration.test_idle_path_settle``).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celeriac import Celeriac, Settings
from celeriac.errors import OperationalError
from celeriac.testing import wait_until
from tests.integration.support import Workers, bound, redis_env, workers

pytestmark = pytest.mark.slow  # a real prefork worker

app = Celeriac("idle_settle", settings=Settings.from_env())


@app.task
def nap(seconds: float, marker: str) -> str:
    with open(marker, "a") as f:  # one line per run: a redelivery would add one
        f.write(f"{os.getpid()}\n")
    time.sleep(seconds)  # sleep-ok: the task's own work
    return "rested"


@app.task
def nap_unsettled(seconds: float, marker: str) -> str:
    """``nap`` in a child whose own broker call fails: the worker settles instead."""
    def refuse(*args: object) -> None:
        raise OperationalError("refused by the test")

    app.transport.settle_here = refuse  # type: ignore[attr-defined]
    return nap(seconds, marker)


@pytest.fixture
def env() -> Iterator[dict[str, str]]:
    with redis_env("idlesettle") as e:
        yield e


@pytest.fixture
def producer(env: dict[str, str]) -> Iterator[Celeriac]:
    with bound(app, env) as a:
        yield a


@pytest.fixture
def pool(env: dict[str, str], tmp_path: Path) -> Iterator[Workers]:
    with workers("tests.integration.test_idle_path_settle", env, tmp_path) as w:
        yield w


def owned(env: dict[str, str]) -> int:
    """Messages some consumer of the test's namespace holds (fetched, not settled)."""
    client = redis.Redis.from_url(env["CELERIAC_BROKER_URL"].split("?")[0])
    try:
        return sum(int(client.scard(key))
                   for key in client.scan_iter(f"{env['NAMESPACE']}:owned:*"))
    finally:
        client.close()


def test_an_idle_workers_child_stores_the_result_and_acks_while_the_worker_is_frozen(
        producer: Celeriac, pool: Workers, env: dict[str, str], tmp_path: Path) -> None:
    w = pool.start("-P", "prefork", "-c", "2")
    marker = tmp_path / "runs"
    r = nap.delay(0.3, str(marker))
    wait_until(marker.exists, 15)
    # The task runs in a child; the worker's main process, which stores a busy worker's
    # results and acks its messages, is stopped from here on.
    os.kill(w.pid, signal.SIGSTOP)
    try:
        assert r.get(timeout=15) == "rested"
        assert owned(env) == 0
    finally:
        os.kill(w.pid, signal.SIGCONT)
    # The worker takes the child's report in and goes on; the task ran once.
    assert nap.delay(0, str(tmp_path / "after")).get(timeout=15) == "rested"
    assert len(marker.read_text().split()) == 1
    assert w.proc is not None and w.proc.poll() is None, w.log
    assert "lost" not in w.log


def test_a_child_that_cannot_settle_leaves_it_to_the_worker(
        producer: Celeriac, pool: Workers, env: dict[str, str], tmp_path: Path) -> None:
    w = pool.start("-P", "prefork", "-c", "1")
    marker = tmp_path / "runs"
    assert nap_unsettled.delay(0, str(marker)).get(timeout=15) == "rested"
    w.wait_for_log("could not settle a message itself")
    wait_until(lambda: owned(env) == 0, 15, message="the message acknowledged")
    # The same child, its broker call still refused (and paused): every later task is
    # settled by the worker, results first.
    results = [nap.delay(0, str(marker)) for _ in range(5)]
    assert [x.get(timeout=15) for x in results] == ["rested"] * 5
    wait_until(lambda: owned(env) == 0, 15, message="the messages acknowledged")
    assert len(marker.read_text().split()) == 6
