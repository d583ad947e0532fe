"""Compressed messages and results between Celery and celeriac on one Redis (kombu's
broker layout, Celery's results): both fleets run with ``task_compression="gzip"`` and
``result_compression="gzip"``, as a Celery project that turned them on would; a call may
ask for another method (``compression="bzip2"``). Redis database 2 is this module's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celeriac import Celeriac, chord, group, signature
from tests.services import require

pytestmark = pytest.mark.slow

DB = 2
PLAIN = f"redis://127.0.0.1:6379/{DB}"
GZIP = {"COMPAT_TASK_COMPRESSION": "gzip", "COMPAT_RESULT_COMPRESSION": "gzip"}
MARK = b"\x00celery-compressed\x00application/x-gzip\x00"


@pytest.fixture(scope="module")
def fleet(fleet_factory: Any) -> Any:
    require("redis")
    redis.Redis(db=DB).flushdb()
    return fleet_factory.redis_pair(PLAIN, **GZIP)


@pytest.fixture(scope="module")
def app(fleet: Any) -> Iterator[Celeriac]:
    app = Celeriac("compat-z", broker=f"{PLAIN}?layout=kombu",
                   backend=f"{PLAIN}?layout=celery", task_compression="gzip",
                   result_compression="gzip")
    yield app
    app.close()


def stored(task_id: str) -> bytes:
    return redis.Redis(db=DB).get(f"celery-task-meta-{task_id}") or b""


def test_celery_sends_compressed_tasks_a_celeriac_worker_runs(fleet: Any) -> None:
    big = "x" * 50_000
    out = fleet.celery.run(
        "rs = [proj.who.apply_async((1,), queue='to_celeriac'),\n"
        f"      proj.who.apply_async(({big!r},), queue='to_celeriac', compression='bzip2'),\n"
        "      proj.who.apply_async((3,), queue='to_celeriac', compression='xz')]\n"
        "out = [[r.get(timeout=20), r.id] for r in rs]")
    assert [value for value, _ in out] == [["celeriac", 1], ["celeriac", big],
                                          ["celeriac", 3]]
    assert all(stored(task_id).startswith(MARK) for _, task_id in out)


def test_celeriac_sends_compressed_tasks_a_celery_worker_runs(app: Celeriac,
                                                              fleet: Any) -> None:
    gz = app.send_task("compat.who", [2], queue="to_celery")
    xz = app.send_task("compat.who", ["y" * 50_000], queue="to_celery", compression="lzma")
    assert gz.get(timeout=20) == ["celery", 2]
    assert xz.get(timeout=20) == ["celery", "y" * 50_000]
    assert stored(gz.id).startswith(MARK)  # Celery 5.7 compressed its result: we read it


def test_each_side_reads_the_others_compressed_results(app: Celeriac, fleet: Any) -> None:
    ours = app.send_task("compat.add", [20, 22], queue="to_celeriac")
    assert ours.get(timeout=20) == 42
    assert stored(ours.id).startswith(MARK)
    assert fleet.celery.run(f"out = app.AsyncResult({ours.id!r}).get(timeout=20)") == 42


def test_a_mixed_chord_with_compressed_parts_completes_once(app: Celeriac,
                                                            fleet: Any) -> None:
    header = group(signature("compat.add", (i, i), app=app).set(
        queue="to_celery" if i % 2 else "to_celeriac") for i in range(8))
    r = chord(header)(signature("compat.total", app=app).set(queue="mixed"))
    assert r.get(timeout=30) == sum(2 * i for i in range(8))
    out = fleet.celery.run(
        "h = group(proj.add.s(i, i).set(queue='to_celery' if i % 2 else 'to_celeriac') "
        "for i in range(8))\n"
        "out = chord(h)(proj.who.s().set(queue='mixed')).get(timeout=30)")
    assert out[1] == [2 * i for i in range(8)]
