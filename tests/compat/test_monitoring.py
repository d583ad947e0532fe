"""Celery's monitoring sees celeriac workers, in compatibility mode (``?layout=kombu``):
a real ``celery inspect`` (Celery 5.7's CLI from ``tests/.venv-celery``) lists a celeriac
worker beside a Celery worker, with replies it accepts; ``app.control`` on celeriac's side
lists both too; Flower, started here on loopback, shows the celeriac worker and its
tasks from our events on ``celeryev``.

One fleet per broker (Redis database 12, RabbitMQ's default virtual host): a Celery
worker, a celeriac worker with ``-E``, and Flower, each on queues and node names of this
run's own, so a suite running beside it on the same RabbitMQ does not disturb it (its
nodes may answer too: the tests look for ours). Every wait has a deadline."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
import redis

from celeriac import Celeriac
from celeriac.testing import wait_until
from tests.compat.conftest import HERE, CeleryWorker, celeriac_worker
from tests.services import require

pytestmark = pytest.mark.slow

DB = 5
SUFFIX = uuid.uuid4().hex[:6]
QUEUE = f"mon_{SUFFIX}"
CELERIAC_NODE, CELERY_NODE = f"celeriac-mon-{SUFFIX}", f"celery-mon-{SUFFIX}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Flower:
    """``celery -A celery_proj flower`` on a free loopback port, its API unauthenticated
    (``FLOWER_UNAUTHENTICATED_API``: Flower 2 refuses the API without auth otherwise)."""

    def __init__(self, venv: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        self.log_path = Path(f"/tmp/celeriac-compat-flower-{os.getpid()}-{SUFFIX}.log")
        self.log_file = open(self.log_path, "wb")  # noqa: SIM115  (closed in stop)
        self.proc = subprocess.Popen(
            [str(venv / "bin" / "celery"), "-A", "celery_proj", "flower",
             "--address=127.0.0.1", f"--port={self.port}"],
            cwd=HERE, env={**os.environ, **env, "FLOWER_UNAUTHENTICATED_API": "true"},
            stdout=self.log_file, stderr=subprocess.STDOUT, start_new_session=True)

    def get(self, path: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}"
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())

    def poll(self, path: str, check: Any, timeout: float, what: str) -> Any:
        """GET ``path`` until ``check(answer)`` holds; fails with Flower's log after
        ``timeout`` s."""
        last: Any = None

        def answered() -> tuple[Any] | None:
            nonlocal last
            if self.proc.poll() is not None:
                raise TimeoutError("Flower exited")
            try:
                last = self.get(path)
            except OSError as exc:  # not listening yet
                last = exc
                return None
            return (last,) if check(last) else None

        try:
            return wait_until(answered, timeout, 0.2, what)[0]
        except TimeoutError:
            pass
        log = self.log_path.read_text(errors="replace")[-3000:]
        pytest.fail(f"Flower: {what} not seen within {timeout:.0f}s; last {last!r}\n{log}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.log_file.close()


def brokers() -> dict[str, tuple[str, str]]:
    """name -> (Celery's broker URL, ours)."""
    redis_url = f"redis://127.0.0.1:6379/{DB}"
    amqp = "amqp://guest:guest@127.0.0.1:5672//"
    return {"redis": (redis_url, f"{redis_url}?layout=kombu"),
            "amqp": (amqp, f"{amqp}?layout=kombu")}


@pytest.fixture(scope="module", params=["redis", "amqp"])
def fleet(request: Any, celery_venv: Path) -> Iterator[dict[str, Any]]:
    require("redis")
    if request.param == "amqp":
        require("rabbitmq")
    redis.Redis(db=DB).flushdb()
    theirs, ours = brokers()[request.param]
    results = f"redis://127.0.0.1:6379/{DB}"
    celery_env = {"COMPAT_BROKER": theirs, "COMPAT_BACKEND": results}
    our_env = {"COMPAT_BROKER": ours, "COMPAT_BACKEND": f"{results}?layout=celery"}
    started: list[Any] = []
    try:
        # Flower first: it starts while the workers do.
        flower = Flower(celery_venv, celery_env)
        started.append(flower)
        started.append(celeriac_worker(our_env, CELERIAC_NODE, QUEUE, "-c", "1", "-E"))
        started.append(CeleryWorker(celery_venv, celery_env, CELERY_NODE, f"{QUEUE}_celery"))
        app = Celeriac("monitor-test", broker=ours, backend=f"{results}?layout=celery")
        yield {"broker": request.param, "celery_env": celery_env, "app": app,
               "flower": flower, "venv": celery_venv, "host": socket.gethostname()}
        app.close()
    finally:
        for thing in reversed(started):
            thing.stop()
        if request.param == "amqp":
            _delete_queues([QUEUE, f"{QUEUE}_celery"])


def _delete_queues(names: list[str]) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1"))
    try:
        channel = connection.channel()
        for name in names:
            channel.queue_delete(name)
            channel.exchange_delete(name)
    finally:
        connection.close()


def celery_inspect(fleet: dict[str, Any], command: str) -> dict[str, Any]:
    """``celery -A celery_proj inspect <command> --json``: the merged replies."""
    done = subprocess.run(
        [str(fleet["venv"] / "bin" / "celery"), "-A", "celery_proj", "inspect", command,
         "--json", "-t", "2"], cwd=HERE, env={**os.environ, **fleet["celery_env"]},
        capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    replies: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return replies


def node(fleet: dict[str, Any], name: str) -> str:
    return f"{name}@{fleet['host']}"


def test_celery_inspect_lists_celeriac_workers(fleet: dict[str, Any]) -> None:
    ours, theirs = node(fleet, CELERIAC_NODE), node(fleet, CELERY_NODE)
    ping = celery_inspect(fleet, "ping")
    assert ping[ours] == {"ok": "pong"} and ping[theirs] == {"ok": "pong"}

    app: Celeriac = fleet["app"]
    slow = app.send_task("compat.slow_who", (8,), queue=QUEUE)

    def running() -> bool:
        active = app.control.inspect(destination=[ours], timeout=1).active() or {}
        return any(t["id"] == slow.id for t in active.get(ours, []))

    wait_until(running, 15, 0.1, message=f"{slow.id} active on {ours}")
    replies = celery_inspect(fleet, "active")
    (task,) = [t for t in replies[ours] if t["id"] == slow.id]
    assert task["name"] == "compat.slow_who" and task["hostname"] == ours
    assert isinstance(task["worker_pid"], int) and task["time_start"] is not None
    assert replies[theirs] == []

    stats = celery_inspect(fleet, "stats")
    assert stats[ours]["pool"]["max-concurrency"] == 1
    assert stats[ours]["broker"]["transport"] == ("redis" if fleet["broker"] == "redis"
                                                  else "amqp")
    assert "pool" in stats[theirs]
    # ...and the other way round: celeriac's app.control sees the Celery worker too.
    pinged = app.control.ping(destination=[ours, theirs], timeout=2)
    assert {name for reply in pinged for name in reply} == {ours, theirs}
    app.control.revoke(slow.id, terminate=True)


def test_flower_shows_celeriac_workers_and_their_tasks(fleet: dict[str, Any]) -> None:
    flower: Flower = fleet["flower"]
    ours = node(fleet, CELERIAC_NODE)
    # Our heartbeats, received by Flower's event receiver: it is listening now.
    flower.poll("/api/workers?status=1", lambda w: w.get(ours) is True, 30,
                f"{ours} alive by its heartbeats")
    app: Celeriac = fleet["app"]
    sent = [app.send_task("compat.add", (i, i), queue=QUEUE) for i in range(3)]
    assert [r.get(timeout=20) for r in sent] == [0, 2, 4]
    tasks = flower.poll(
        "/api/tasks", lambda t: all(t.get(r.id, {}).get("state") == "SUCCESS" for r in sent),
        20, "the three tasks succeeded")
    for r in sent:
        task = tasks[r.id]
        assert task["name"] == "compat.add" and task["worker"] == ours
        assert task["received"] and task["started"] and task["succeeded"]
    assert tasks[sent[1].id]["result"] == "2" and tasks[sent[1].id]["args"] == "(1, 1)"
    # Flower's inspect of the worker (stats, registered, active queues... over the pidbox).
    workers = flower.poll("/api/workers?refresh=1", lambda w: ours in w, 20,
                          f"{ours} in Flower's inspect")
    assert workers[ours]["stats"]["pool"]["max-concurrency"] == 1
    assert "compat.add" in workers[ours]["registered"]
    assert [q["name"] for q in workers[ours]["active_queues"]] == [QUEUE]
