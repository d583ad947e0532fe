"""Fanout (``kombu.common.Broadcast``) and ``worker_direct`` queues on real brokers, with
two real workers per broker (``test_broadcast_app.py``): every worker consuming a
Broadcast queue runs its own copy, on Redis (copies made at publish time into each
bound worker's queue) and on RabbitMQ (a fanout exchange, an auto-delete queue per
worker); ``apply_async(queue="<hostname>.dq")`` reaches one worker alone. One fleet
per broker for the module (the workers cost more than the tests)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from celeriac import Celeriac
from celeriac.errors import ConfigurationError
from celeriac.testing import WorkerProcess, wait_until
from tests.contracts.conftest import _drop_amqp_namespace
from tests.integration import test_broadcast_app as routing_app
from tests.integration.support import redis_env
from tests.services import require

pytestmark = pytest.mark.slow

QUEUES = ("celery", "images", "everything", "fleet", "celeriac.dead")
HOSTS = ("w1@bc", "w2@bc")


def start(env: dict[str, str], hostname: str, wait: bool = True) -> WorkerProcess:
    return WorkerProcess("tests.integration.test_broadcast_app", "-P", "solo", "-n",
                         hostname, "--without-gossip", "--without-mingle",
                         env=env).start(30, wait_ready=wait)


@pytest.fixture(scope="module", params=["redis", "rabbitmq"])
def fleet(request: pytest.FixtureRequest) -> Iterator[tuple[Celeriac, list[WorkerProcess],
                                                            dict[str, str]]]:
    with redis_env("bc", WORKER_LEASE_TIMEOUT=2.0) as env:
        amqp = None
        if request.param == "rabbitmq":
            amqp = f"{require('rabbitmq')}?namespace=bc{uuid.uuid4().hex[:10]}."
            env = {**env, "CELERIAC_BROKER_URL": amqp}
        workers = [start(env, host, wait=False) for host in HOSTS]  # side by side
        try:
            for w in workers:
                w.wait_for_log(r" ready: ", 30)
            with pointed(routing_app.app, env) as app:
                yield app, workers, env
        finally:
            for w in workers:
                w.kill()
            if amqp is not None:
                _drop_amqp_namespace(amqp, (*QUEUES, *(f"{h}.dq" for h in HOSTS)), ())


@contextmanager
def pointed(app: Celeriac, env: dict[str, str]) -> Iterator[Celeriac]:
    """``app`` (its queues and routes kept) on ``env``'s broker and backend."""
    before = app.settings
    app.close()
    app.settings = before.replace(broker_url=env["CELERIAC_BROKER_URL"],
                                  result_backend=env["CELERIAC_RESULT_BACKEND"])
    try:
        yield app
    finally:
        app.close()
        app.settings = before


def ran(worker: WorkerProcess, task_id: str) -> list[str]:
    """What ``worker`` returned for ``task_id`` (one item per run)."""
    return re.findall(rf"\[{task_id}\] succeeded in [^:]*: '([^']*)'", worker.log)


def test_every_worker_runs_its_own_copy_of_a_broadcast(fleet: Any) -> None:
    _app, workers, _ = fleet
    now = routing_app.reload.delay("now")
    later = routing_app.reload.apply_async(("later",), countdown=0.5)
    for w, host in zip(workers, HOSTS, strict=True):
        wait_until(lambda w=w: ran(w, now.id) and ran(w, later.id), 20,
                   message=f"{host} ran both broadcasts")
        assert ran(w, now.id) == [f"now@{host}"]
        assert ran(w, later.id) == [f"later@{host}"]
        assert "exists with other arguments" not in w.log  # parked in its own queue as is


def test_worker_direct_queue_reaches_one_worker(fleet: Any) -> None:
    app, _workers, _ = fleet
    for host in HOSTS:
        assert routing_app.where.apply_async(queue=f"{host}.dq").get(timeout=20) == host
    replies = app.control.inspect(destination=[HOSTS[0]], timeout=5).active_queues()
    assert set(replies) == {HOSTS[0]}
    assert f"{HOSTS[0]}.dq" in {q["name"] for q in replies[HOSTS[0]]}


def test_redis_broadcast_copy_survives_its_worker_being_killed(
        fleet: Any, tmp_path: Path) -> None:
    """At least once per worker on Redis: the copy a worker held when it died waits in
    its own queue and runs when a worker of that hostname comes back."""
    _app, workers, env = fleet
    if "redis" not in env["CELERIAC_BROKER_URL"]:
        pytest.skip("RabbitMQ deletes an auto-delete queue with its worker (Celery's too)")
    marker = tmp_path / "started"
    result = routing_app.block.apply_async((str(marker),), queue="fleet")
    wait_until(lambda: marker.exists() and all(ran(w, result.id) for w in workers[:1]), 20,
               message="w1 ran its copy and w2 started its own")
    workers[1].kill()
    workers[1] = start(env, HOSTS[1])
    wait_until(lambda: ran(workers[1], result.id), 30, message="w2 ran its copy again")
    assert ran(workers[1], result.id) == [f"again@{HOSTS[1]}"]


def test_a_broadcast_on_a_broker_without_fanout_is_refused() -> None:
    app = Celeriac("nofanout", broker_url="memory://",
                   task_queues=routing_app.app.settings.task_queues)
    with pytest.raises(ConfigurationError, match="fanout"):
        app.send_task("routing_app.reload", ("x",), queue="fleet")
