"""SQS under faults (moto's server, ``tests/services.py``): a worker killed mid-drain
loses nothing (its messages come back when their visibility lapses), and a task longer
than the visibility timeout runs once (the worker extends what it holds).

The second test's workers load this module as their app (``app`` below: the integration
tasks' app, plus ``counted``, which counts its runs in Redis)."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from celeriac import Celeriac, Settings
from celeriac.testing import WorkerProcess, wait_until
from tests.integration import app_tasks as t
from tests.services import require, sqs_url

pytestmark = pytest.mark.slow

VISIBILITY = 3
"""The queues' visibility timeout (s): what a killed worker's messages wait out."""

app = t.app


@t.app.task
def counted(seconds: float, key: str) -> int:
    """Sleeps ``seconds``; returns how many times it has started (Redis ``key``)."""
    import redis

    client = redis.Redis.from_url(os.environ["CELERIAC_RESULT_BACKEND"].partition("?")[0])
    try:
        runs = int(client.incr(key))
        client.expire(key, 600)
    finally:
        client.close()
    time.sleep(seconds)  # sleep-ok: the task's own work
    return runs


@pytest.fixture
def on_sqs(env: dict[str, str], app: Celeriac) -> Iterator[Callable[..., None]]:
    """Point the app and its workers at SQS (a namespace of the test's own) with results
    (and broadcasts) in Redis."""
    ns = f"f{uuid.uuid4().hex[:10]}"
    backend = f"{require('redis')}?namespace={ns}r"

    def point(**extra: str) -> None:
        env.update(CELERIAC_BROKER_URL=sqs_url(ns, visibility_timeout=str(VISIBILITY)),
                   CELERIAC_RESULT_BACKEND=backend, **extra)
        app.close()
        app.settings = Settings.from_env(env)

    yield point
    app.close()
    from tests.contracts.conftest import _drop_redis_namespace

    _drop_redis_namespace(backend)


def test_kill_9_mid_drain_loses_nothing(app: Celeriac, on_sqs: Callable[..., None],
                                        start_worker: Callable[..., WorkerProcess]) -> None:
    on_sqs(CELERIAC_WORKER_PREFETCH_MULTIPLIER="50")
    results = t.sleep.delay_many([(0.01,)] * 80)
    first = start_worker("-c", "2")
    wait_until(lambda: sum(r.ready() for r in results[:40]) >= 10, 30,
               message="the first worker is running tasks")
    first.signal(signal.SIGKILL, group=True)  # no goodbye: its messages stay invisible
    first.wait(5)
    start_worker("-c", "2")
    done = app.backend.wait_for([r.id for r in results], timeout=90)
    assert len(done) == 80, f"{80 - len(done)} tasks never completed"
    assert all(m.state == "SUCCESS" for m in done.values())


def test_task_longer_than_the_visibility_timeout_runs_once(
        app: Celeriac, env: dict[str, str], on_sqs: Callable[..., None],
        tmp_path: Path) -> None:
    import redis

    on_sqs(CELERIAC_WORKER_PREFETCH_MULTIPLIER="1")
    # Two workers with a free slot each: a lapsed visibility would hand the message to
    # one of them while the first run goes on.
    workers = [WorkerProcess(__name__, "-c", "2", env=env, cwd=str(tmp_path))
               for _ in range(2)]
    key = f"celeriac-test:{uuid.uuid4().hex}"
    try:
        for w in workers:
            w.start(wait_ready=False)  # both start at once
        for w in workers:
            w.wait_for_log(r" ready: ", 30)
        result = counted.delay(3 * VISIBILITY, key)
        assert result.get(timeout=60) == 1
        # A second run would have started within a visibility of a lapse: none did, and
        # no copy of the message is left anywhere.
        client = redis.Redis.from_url(require("redis"))
        try:
            assert int(client.get(key) or 0) == 1
            wait_until(lambda: app.transport.queue_length("celery") == 0, 10,
                       message="the queue is empty")
            assert int(client.get(key) or 0) == 1
        finally:
            client.delete(key)
            client.close()
    finally:
        for w in workers:
            w.kill()
