"""Celery and celeriac on one Redis, in compatibility mode: a real Celery 5 worker and
client (``tests/.venv-celery``) beside a real celeriac worker and this test's celeriac
client; kombu's broker layout (``?layout=kombu``), Celery's results (``?layout=celery``).

Each worker has a queue of its own (``to_celery``, ``to_celeriac``), so a test can say
which side runs a task, and both consume ``mixed``. Redis database 8 is this module's."""

from __future__ import annotations

import datetime
import decimal
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import redis

from celeriac import Celeriac, chain, chord, group, signature
from tests.compat.conftest import CeleryError, counted_chords, settle
from tests.services import require

pytestmark = pytest.mark.slow

DB = 8
PLAIN = f"redis://127.0.0.1:6379/{DB}"


@pytest.fixture(scope="module")
def fleet(fleet_factory: Any) -> Any:
    require("redis")
    redis.Redis(db=DB).flushdb()
    return fleet_factory.redis_pair(PLAIN, COMPAT_EXTENDED="1", COMPAT_COUNTER=PLAIN)


@pytest.fixture(scope="module")
def app(fleet: Any) -> Iterator[Celeriac]:
    app = Celeriac("compat-test", broker=f"{PLAIN}?layout=kombu",
                   backend=f"{PLAIN}?layout=celery", result_extended=True)
    yield app
    app.close()


def celery(fleet: Any, code: str, timeout: float = 60) -> Any:
    return fleet.celery.run(code, timeout)


def test_celery_producer_celeriac_worker(fleet: Any) -> None:
    out = celery(fleet, "r = proj.who.apply_async((1,), queue='to_celeriac')\n"
                        "out = [r.get(timeout=20), r.name, r.worker, r.queue]")
    assert out[0] == ["celeriac", 1]
    assert out[1] == "compat.who" and out[2].startswith("celeriac1@") \
        and out[3] == "to_celeriac"
    with pytest.raises(CeleryError, match="ValueError: bad input"):
        celery(fleet, "proj.boom.apply_async(('bad input',), queue='to_celeriac')"
                      ".get(timeout=20)")


def test_celeriac_producer_celery_worker(app: Celeriac, fleet: Any) -> None:
    r = app.send_task("compat.who", [2], queue="to_celery")
    assert r.get(timeout=20) == ["celery", 2]
    failed = app.send_task("compat.boom", ["from celery"], queue="to_celery")
    with pytest.raises(ValueError, match="from celery"):
        failed.get(timeout=20)


TYPED = (datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC), datetime.date(2026, 1, 2),
         decimal.Decimal("10.25"), uuid.UUID(int=7), b"raw \xff bytes")
TYPE_NAMES = ["datetime", "date", "Decimal", "UUID", "bytes"]


def test_json_types_travel_with_kombu_s_markers_both_ways(app: Celeriac, fleet: Any) -> None:
    # To a Celery worker: it decodes each argument as its own type, and its result (the
    # same values) comes back to us as those types.
    names, values = app.send_task("compat.types", TYPED, queue="to_celery").get(timeout=20)
    assert names == TYPE_NAMES and tuple(values) == TYPED
    # From a Celery producer to our worker: the same, seen from Celery's side.
    out = celery(fleet, "import datetime, decimal, uuid\n"
                        "args = (datetime.datetime(2026, 1, 2, 3, 4, 5, "
                        "tzinfo=datetime.timezone.utc), datetime.date(2026, 1, 2), "
                        "decimal.Decimal('10.25'), uuid.UUID(int=7), b'raw \\xff bytes')\n"
                        "names, values = proj.types.apply_async(args, queue='to_celeriac')"
                        ".get(timeout=20)\n"
                        "out = [names, tuple(values) == args]")
    assert out == [TYPE_NAMES, True]


def test_results_have_celerys_shape(app: Celeriac, fleet: Any) -> None:
    ours = app.send_task("compat.add", [1, 2], queue="to_celeriac")
    theirs = app.send_task("compat.add", [1, 2], queue="to_celery")
    assert ours.get(timeout=20) == theirs.get(timeout=20) == 3
    client = redis.Redis(db=DB)
    mine = orjson.loads(client.get(f"celery-task-meta-{ours.id}") or b"{}")
    celerys = orjson.loads(client.get(f"celery-task-meta-{theirs.id}") or b"{}")
    assert set(mine) == set(celerys)
    assert list(mine)[:6] == ["status", "result", "traceback", "children", "date_done",
                             "task_id"]


def test_eta_both_ways(app: Celeriac, fleet: Any) -> None:
    # Published at once with its eta header, as Celery does: the Celery worker holds it.
    r = app.send_task("compat.who", ["later"], queue="to_celery", countdown=1)
    assert r.get(timeout=20) == ["celery", "later"]
    # A Celery producer's eta message: the celeriac worker parks it until due.
    out = celery(fleet, "import time\nstart = time.time()\n"
                        "r = proj.who.apply_async(('eta',), queue='to_celeriac', countdown=1)\n"
                        "out = [r.get(timeout=20), time.time() - start]")
    assert out[0] == ["celeriac", "eta"] and out[1] >= 0.9


def test_priority_steps_are_kombus(app: Celeriac, fleet: Any) -> None:
    r = app.send_task("compat.add", [2, 2], queue="to_celeriac", priority=7)
    assert r.get(timeout=20) == 4
    client = redis.Redis(db=DB)
    assert client.exists("to_celeriac") == 0 or client.llen("to_celeriac") == 0


def test_chain_from_celery(fleet: Any) -> None:
    out = celery(fleet, "c = chain(proj.add.s(1, 1).set(queue='to_celeriac'), "
                        "proj.add.s(10).set(queue='to_celery'), "
                        "proj.mul.s(2).set(queue='to_celeriac'))\n"
                        "r = c.apply_async()\nout = [r.get(timeout=30), r.parent.get(timeout=5)]")
    assert out == [24, 12]


def test_chain_from_celeriac(app: Celeriac, fleet: Any) -> None:
    c = chain(signature("compat.add", (2, 2), app=app).set(queue="to_celery"),
              signature("compat.mul", (10,), app=app).set(queue="to_celeriac"),
              signature("compat.add", (1,), app=app).set(queue="to_celery"))
    r = c.apply_async()
    assert r.get(timeout=30) == 41


def test_links_from_each_side(app: Celeriac, fleet: Any) -> None:
    out = celery(fleet, "r = proj.add.apply_async((3, 4), queue='to_celeriac', "
                        "link=proj.who.s().set(queue='to_celery'))\nr.get(timeout=20)\n"
                        "import time\n"
                        "for _ in range(200):\n"
                        "    r = app.AsyncResult(r.id)\n"
                        "    if r.children: break\n"
                        "    time.sleep(0.05)\n"  # sleep-ok: the Celery client polls
                        "out = r.children[0].get(timeout=20)")
    assert out == ["celery", 7]
    errback = signature("compat.log_error", app=app).set(queue="to_celeriac")
    failed = app.send_task("compat.boom", ["x"], queue="to_celery")
    assert failed.id
    r = app.signature("compat.boom", ("y",)).set(queue="to_celery", link_error=errback)
    res = r.apply_async()
    with pytest.raises(ValueError):
        res.get(timeout=20)


def test_mixed_chord_completes_once(app: Celeriac, fleet: Any) -> None:
    """Header tasks alternate between the two fleets; the body runs once, with the
    results in member order, whichever side sent the chord."""
    header = group(signature("compat.add", (i, i), app=app).set(
        queue="to_celery" if i % 2 else "to_celeriac") for i in range(10))
    body = signature("compat.total", app=app).set(queue="mixed")
    r = chord(header)(body)
    assert r.get(timeout=30) == sum(2 * i for i in range(10))
    out = celery(fleet, "h = group(proj.add.s(i, i).set(queue='to_celery' if i % 2 else "
                        "'to_celeriac') for i in range(10))\n"
                        "r = chord(h)(proj.who.s().set(queue='mixed'))\n"
                        "out = r.get(timeout=30)")
    assert out[1] == [2 * i for i in range(10)]
    client = redis.Redis(db=DB)
    settle(lambda: not client.keys("celery-taskset-meta-*.j"), 5)
    assert client.keys("celery-taskset-meta-*.j") == []


def test_many_chords_fire_once(app: Celeriac, fleet: Any) -> None:
    """Twenty chords of 6 from each side, header tasks on both fleets, bodies on either:
    each body ran exactly once (Celery and celeriac count the parts in one zset; one of
    them sees the last) and got the results in member order."""
    results, code = counted_chords(app, 20, 6, "runs")
    assert [r.get(timeout=60) for r in results] == [6 * n + 15 for n in range(20)]
    out = celery(fleet, code)
    assert out == [6 * n + 15 for n in range(20)]
    client = redis.Redis(db=DB)
    runs = client.mget([f"runs:{side}:{n}" for side in ("ours", "theirs")
                        for n in range(20)])
    assert runs == [b"1"] * 40
