"""kombu's and Celery's ``global_keyprefix`` (one Redis shared by several apps): with
``broker_transport_options`` and ``result_backend_transport_options`` set as in the
Celery deployment, celeriac and Celery run each other's tasks, read each other's
results, and ``celery inspect`` reaches celeriac workers, and every key either side
writes starts with the prefix. Redis database 9."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from celeriac import Celeriac, chord, group, signature
from tests.compat.conftest import HERE
from tests.services import require

pytestmark = pytest.mark.slow

DB = 9
URL = f"redis://127.0.0.1:6379/{DB}"
PREFIX = "shared:"
RESULT_PREFIX = "shared:"  # ends in ':', so Celery adds no '_'


@pytest.fixture(scope="module")
def fleet(fleet_factory: Any) -> Any:
    require("redis")
    redis.Redis(db=DB).flushdb()
    theirs = {"COMPAT_BROKER": URL, "COMPAT_BACKEND": URL, "COMPAT_KEYPREFIX": PREFIX,
              "COMPAT_COUNTER": URL}
    ours = {"COMPAT_BROKER": f"{URL}?layout=kombu", "COMPAT_BACKEND": f"{URL}?layout=celery",
            "COMPAT_KEYPREFIX": PREFIX, "COMPAT_COUNTER": URL}
    fleet_factory.env = theirs
    fleet_factory.celery_worker(theirs, "prefix-celery", "p_celery,p_mixed")
    fleet_factory.celeriac_worker(ours, "prefix-celeriac", "p_celeriac,p_mixed", "-c", "2")
    fleet_factory.celery = fleet_factory.client(theirs)
    return fleet_factory


@pytest.fixture(scope="module")
def app(fleet: Any) -> Iterator[Celeriac]:
    options = {"global_keyprefix": PREFIX}
    app = Celeriac("prefix-test", broker=f"{URL}?layout=kombu",
                   backend=f"{URL}?layout=celery", broker_transport_options=options,
                   result_backend_transport_options=options)
    yield app
    app.close()


def test_tasks_and_results_cross_under_the_prefix(app: Celeriac, fleet: Any) -> None:
    assert app.send_task("compat.who", [1], queue="p_celery").get(timeout=20) == ["celery", 1]
    out = fleet.celery.run("r = proj.who.apply_async((2,), queue='p_celeriac')\n"
                           "out = r.get(timeout=20)")
    assert out == ["celeriac", 2]
    mine = app.send_task("compat.who", [3], queue="p_celeriac")
    assert mine.get(timeout=20) == ["celeriac", 3]
    client = redis.Redis(db=DB)
    stored = client.get(f"{RESULT_PREFIX}celery-task-meta-{mine.id}")
    assert stored is not None and orjson.loads(stored)["result"] == ["celeriac", 3]
    # Nothing either side wrote lies outside the prefix (kombu prefixes every key).
    assert outside_prefix(client, [mine.id]) == []


def outside_prefix(client: redis.Redis, task_ids: list[str]) -> list[bytes]:
    """The keys either side would have written had it ignored the prefix: the twin of
    every key under it (queues, bindings, unacked, results) and the results of
    ``task_ids``. Only this deployment's names are looked at, not the whole database."""
    prefix = PREFIX.encode()
    twins = [k[len(prefix):] for k in client.scan_iter(match=PREFIX + "*", count=1000)]
    names = twins + [f"celery-task-meta-{i}".encode() for i in task_ids]
    return [name for name in names if client.exists(name)]


def test_a_mixed_chord_under_the_prefix(app: Celeriac, fleet: Any) -> None:
    header = group(signature("compat.add", (i, i), app=app).set(
        queue="p_celery" if i % 2 else "p_celeriac") for i in range(6))
    r = chord(header)(signature("compat.total", app=app).set(queue="p_mixed"))
    assert r.get(timeout=30) == 30
    assert redis.Redis(db=DB).exists(f"{RESULT_PREFIX}celery-taskset-meta-{r.parent.id}.j") \
        == 0  # counted in the prefixed keys, and cleaned up once fired


def test_celery_inspect_reaches_a_celeriac_worker_under_the_prefix(
        fleet: Any, celery_venv: Path) -> None:
    done = subprocess.run(
        [str(celery_venv / "bin" / "celery"), "-A", "celery_proj", "inspect", "ping",
         "--json", "-t", "2"], cwd=HERE, env={**os.environ, **fleet.env},
        capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    replies = orjson.loads(done.stdout.decode().strip().splitlines()[-1])
    host = socket.gethostname()
    assert replies.get(f"prefix-celeriac@{host}") == {"ok": "pong"}
    assert replies.get(f"prefix-celery@{host}") == {"ok": "pong"}
