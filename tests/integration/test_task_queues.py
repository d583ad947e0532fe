"""``task_queues`` as a Celery project declares them (kombu ``Queue`` objects), on Redis:
routes by routing key reach the queue bound by it, and a worker started without ``-Q``
consumes every declared queue (``-X`` leaves some out), as Celery's does."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from celeriac import Celeriac
from celeriac.testing import WorkerProcess
from tests.integration import queues_app
from tests.integration.support import redis_env

pytestmark = pytest.mark.slow


@pytest.fixture
def env() -> Iterator[dict[str, str]]:
    with redis_env("tq") as env:
        yield env


@pytest.fixture
def app(env: dict[str, str]) -> Iterator[Celeriac]:
    app = queues_app.app
    before = app.settings
    app.close()
    app.settings = before.replace(broker_url=env["CELERIAC_BROKER_URL"],
                                  result_backend=env["CELERIAC_RESULT_BACKEND"])
    yield app
    app.close()
    app.settings = before


def worker(env: dict[str, str], *args: str) -> WorkerProcess:
    return WorkerProcess("tests.integration.queues_app", "-P", "solo", *args, env=env).start()


def test_routes_by_routing_key_reach_the_declared_queue(app: Celeriac) -> None:
    queues_app.encode.delay(1)
    app.send_task("queues_app.ping", routing_key="media.video")
    queues_app.ping.delay()
    assert app.transport.queue_length("media") == 2
    assert app.transport.queue_length("default") == 1
    assert app.default_queues == ["default", "media"]


def test_a_worker_without_q_consumes_every_declared_queue_and_x_leaves_some_out(
        app: Celeriac, env: dict[str, str]) -> None:
    encoded = queues_app.encode.delay(21)
    pinged = queues_app.ping.delay()

    w = worker(env, "-X", "media")
    try:
        assert pinged.get(timeout=15) == "pong"
        assert app.transport.queue_length("media") == 1  # excluded: left waiting
    finally:
        assert w.stop() == 0

    w = worker(env)
    try:
        assert encoded.get(timeout=15) == 42
    finally:
        assert w.stop() == 0


def test_x_that_leaves_nothing_is_a_usage_error(env: dict[str, str]) -> None:
    w = WorkerProcess("tests.integration.queues_app", "-P", "solo", "-X", "default,media",
                      env=env).start(wait_ready=False)
    assert w.wait(15) == 2
    assert "-X default,media leaves no queue to consume" in w.log


def test_q_naming_an_undeclared_queue_is_refused_when_queues_are_not_made_on_use(
        env: dict[str, str]) -> None:
    w = WorkerProcess("tests.integration.queues_app", "-P", "solo", "-Q", "default,typo",
                      env={**env, "CELERIAC_TASK_CREATE_MISSING_QUEUES": "false"}
                      ).start(wait_ready=False)
    assert w.wait(15) == 2
    assert "queue 'typo' is not declared in task_queues" in w.log
