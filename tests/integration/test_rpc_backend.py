"""``result_backend="rpc://"``: results come back as messages to the caller's reply queue
on RabbitMQ, through one real prefork worker shared by the module (queues of its own, by
the broker URL's namespace)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pika
import pytest

from celeriac import Celeriac, GroupResult, Settings, chord, group
from celeriac.backends.rpc import NotSupportedByRPC
from celeriac.errors import TaskRevoked
from celeriac.testing import WorkerProcess, wait_until
from tests.integration import app_tasks as t
from tests.services import require

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    broker = f"{require('rabbitmq')}?namespace=t{uuid.uuid4().hex[:12]}"
    return {"CELERIAC_BROKER_URL": broker, "CELERIAC_RESULT_BACKEND": "rpc://",
            "CELERIAC_TASK_TRACK_STARTED": "true", "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def app(env: dict[str, str]) -> Iterator[Celeriac]:
    before = t.app.settings
    t.app.close()
    t.app.settings = Settings.from_env(env)
    yield t.app
    t.app.close()
    t.app.settings = before


@pytest.fixture(scope="module")
def worker(env: dict[str, str], app: Celeriac, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[WorkerProcess]:
    w = WorkerProcess("tests.integration.app_tasks", "-c", "2", "-P", "prefork",
                      env=env, cwd=str(tmp_path_factory.mktemp("rpc")))
    w.start(30)
    yield w
    w.kill()


def test_results_and_failures_come_back_to_the_caller(app: Celeriac, worker: WorkerProcess
                                                      ) -> None:
    r = t.add.delay(2, 3)
    reply_to = app.backend.reply_to  # type: ignore[attr-defined]
    assert r.get(timeout=20) == 5 and r.state == "SUCCESS"
    with pytest.raises(ValueError):
        t.boom.delay("value").get(timeout=20)
    # Many at once, read as they come (one queue for all of this process's tasks).
    results = [t.add.delay(i, i) for i in range(30)]
    assert [x.get(timeout=20) for x in results] == [2 * i for i in range(30)]
    # The queue is the process's own: auto-delete and durable, as Celery declares it.
    conn = pika.BlockingConnection(pika.URLParameters(require("rabbitmq").rstrip("/") + "/"))
    try:
        assert conn.channel().queue_declare(reply_to, passive=True).method.queue == reply_to
    finally:
        conn.close()


def test_only_the_caller_reads_its_results(app: Celeriac, worker: WorkerProcess) -> None:
    r = t.add.delay(20, 22)
    assert r.get(timeout=20) == 42
    other = Celeriac("other", broker=app.settings.broker_url, backend="rpc")  # Celery's too
    try:
        assert other.AsyncResult(r.id).state == "PENDING"
        assert other.backend.wait_for([r.id], 0.3) == {}
    finally:
        other.close()


def test_states_come_too_started_and_custom(app: Celeriac, worker: WorkerProcess,
                                            tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    r = t.progress.delay(str(gate))
    wait_until(lambda: r.state == "PROGRESS", 15, message="PROGRESS replied")
    assert r.info == {"done": 1, "total": 2}
    gate.touch()
    assert r.get(timeout=20) == "finished"
    s = t.sleep.delay(2.0)  # task_track_started: STARTED comes while it sleeps
    wait_until(lambda: s.state == "STARTED", 15, message="STARTED replied")
    assert s.info["pid"] != os.getpid()
    assert s.get(timeout=20) == 2.0


def test_states_the_worker_decides_before_running_come_back_too(
        app: Celeriac, worker: WorkerProcess) -> None:
    expired = t.add.apply_async((1, 2), expires=datetime.now(UTC) - timedelta(seconds=5))
    with pytest.raises(TaskRevoked):
        expired.get(timeout=20)
    unknown = app.send_task("tests.integration.app_tasks.no_such_task", [1])
    with pytest.raises(Exception, match="no_such_task"):
        unknown.get(timeout=20)
    assert unknown.state == "FAILURE"


def test_a_chain_and_a_group_reply_to_the_process_that_sent_them(
        app: Celeriac, worker: WorkerProcess) -> None:
    r = (t.add.s(1, 2) | t.add.s(10) | t.add.s(100)).apply_async()
    assert r.get(timeout=20) == 113
    g = group(t.add.s(i, 1) for i in range(5)).apply_async()
    assert g.get(timeout=20) == [i + 1 for i in range(5)]


def test_chords_and_saved_groups_are_refused_with_the_reason(
        app: Celeriac, worker: WorkerProcess) -> None:
    with pytest.raises(NotImplementedError, match="does not support chords"):
        app.backend.ensure_chords_allowed()
    with pytest.raises(NotSupportedByRPC, match="does not support chords"):
        chord(t.add.s(i, i) for i in range(3))(t.total.s())
    with pytest.raises(NotSupportedByRPC, match="does not support chords"):
        (group(t.add.s(i, i) for i in range(3)) | t.total.s()).apply_async()
    with pytest.raises(NotImplementedError, match=r"GroupResult\.save"):
        GroupResult(uuid.uuid4().hex, [], app).save()


def test_a_final_state_is_not_replaced_by_an_earlier_one_arriving_late(app: Celeriac
                                                                        ) -> None:
    """STARTED leaves from the pool child, the result from the worker's main process, on
    two connections the broker need not keep in order: SUCCESS then a late STARTED still
    reads SUCCESS."""
    task_id = uuid.uuid4().hex
    destination = {"reply_to": app.backend.reply_to,  # type: ignore[attr-defined]
                   "correlation_id": task_id}
    worker_side = Celeriac("worker-side", broker=app.settings.broker_url, backend="rpc://")
    try:
        b = worker_side.backend
        b.store_many([b.encode(task_id, "SUCCESS", 7, properties=destination),
                      b.encode(task_id, "STARTED", {"pid": 1}, properties=destination)])
        b.store("no-caller", "SUCCESS", 1)  # no reply_to: nobody to tell, nothing sent
    finally:
        worker_side.close()
    assert app.AsyncResult(task_id).get(timeout=10) == 7
    assert app.AsyncResult(task_id).state == "SUCCESS"
