"""Results in the tables of Celery's SQLAlchemy backend on PostgreSQL
(``db+postgresql://``): a Celery worker's results read by celeriac and a celeriac
worker's read by a Celery client, failures and extended fields included; saved groups
restored by the other side; chords completed by ``celery.chord_unlock`` (Celery's way on
this backend) whichever side sent them and whichever worker polls. The broker is Redis
in kombu's layout (database 6); the tables live in database ``celeriac_compat``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import redis

from celeriac import Celeriac, GroupResult, chord, group, signature
from tests.compat.conftest import CeleryError, counted_chords
from tests.services import require

pytestmark = pytest.mark.slow

DB = 6
BROKER = f"redis://127.0.0.1:6379/{DB}"
RESULTS = "db+postgresql://postgres@127.0.0.1:5432/celeriac_compat"


@pytest.fixture(scope="module")
def fleet(fleet_factory: Any) -> Any:
    require("redis")
    url = require("postgres")
    redis.Redis(db=DB).flushdb()
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as admin:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = 'celeriac_compat'"
                             ).fetchone():
            admin.execute("CREATE DATABASE celeriac_compat")
    with psycopg.connect(RESULTS.replace("db+", ""), autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS celery_taskmeta, celery_tasksetmeta, "
                     "celeriac_chord_parts, celeriac_chords")
    theirs = {"COMPAT_BROKER": BROKER, "COMPAT_BACKEND": RESULTS, "COMPAT_EXTENDED": "1",
              "COMPAT_COUNTER": BROKER}
    ours = {"COMPAT_BROKER": f"{BROKER}?layout=kombu", "COMPAT_BACKEND": RESULTS,
            "COMPAT_EXTENDED": "1", "COMPAT_COUNTER": BROKER}
    # Celery creates its tables first (as in a running deployment).
    fleet_factory.celery = fleet_factory.client(theirs)
    fleet_factory.celery.run("proj.app.backend.ResultSession(); out = 1")
    fleet_factory.celery_worker(theirs, "pg-celery", "to_celery,mixed")
    fleet_factory.celeriac_worker(ours, "pg-celeriac", "to_celeriac,mixed", "-c", "1")
    return fleet_factory


@pytest.fixture(scope="module")
def app(fleet: Any) -> Iterator[Celeriac]:
    app = Celeriac("compat-pg", broker=f"{BROKER}?layout=kombu", backend=RESULTS,
                   result_extended=True)
    yield app
    app.close()


def test_celeriac_reads_celerys_results(app: Celeriac, fleet: Any) -> None:
    r = app.send_task("compat.who", ["pg"], queue="to_celery")
    assert r.get(timeout=20) == ["celery", "pg"]
    assert r.name == "compat.who" and r.args == ["pg"]
    with pytest.raises(ValueError, match="broken"):
        app.send_task("compat.boom", ["broken"], queue="to_celery").get(timeout=20)


def test_celery_reads_celeriacs_results(fleet: Any) -> None:
    out = fleet.celery.run("r = proj.who.apply_async(('pg',), queue='to_celeriac')\n"
                           "out = [r.get(timeout=20), r.name, r.args, r.worker]")
    assert out[0] == ["celeriac", "pg"] and out[1] == "compat.who" and out[2] == ["pg"]
    assert out[3].startswith("pg-celeriac@")
    with pytest.raises(CeleryError, match="ValueError: worse"):
        fleet.celery.run("proj.boom.apply_async(('worse',), queue='to_celeriac')"
                         ".get(timeout=20)")


def test_groups_saved_by_one_side_are_restored_by_the_other(app: Celeriac, fleet: Any
                                                            ) -> None:
    ours = group(signature("compat.who", (i,), app=app).set(queue="to_celeriac")
                 for i in range(3)).apply_async()
    ours.save()
    out = fleet.celery.run(f"g = app.GroupResult.restore({ours.id!r})\n"
                           "out = g.get(timeout=20)")
    assert out == [["celeriac", i] for i in range(3)]
    gid = fleet.celery.run("g = group(proj.who.s(i).set(queue='to_celery') "
                           "for i in range(3)).apply_async()\n"
                           "g.save()\nout = g.id")
    theirs = GroupResult.restore(gid, app=app)
    assert theirs is not None and theirs.get(timeout=20) == [["celery", i] for i in range(3)]


def test_mixed_chords_complete_once_from_either_side(app: Celeriac, fleet: Any) -> None:
    """Header tasks alternate between the fleets; the chord_unlock task and the body go
    to a queue both consume, so either side polls. Each body runs once."""
    ours, code = counted_chords(app, 4, 4, "pg")
    out = fleet.celery.run(code, 90)
    assert out == [4 * n + 6 for n in range(4)]
    assert [r.get(timeout=60) for r in ours] == [4 * n + 6 for n in range(4)]
    runs = redis.Redis(db=DB).mget([f"pg:{side}:{n}" for side in ("ours", "theirs")
                                    for n in range(4)])
    assert runs == [b"1"] * 8


def test_a_failed_header_task_fails_the_chord_on_both_sides(app: Celeriac, fleet: Any
                                                           ) -> None:
    header = [signature("compat.add", (1, 1), app=app).set(queue="to_celery"),
              signature("compat.boom", ("header",), app=app).set(queue="to_celeriac")]
    r = chord(header)(signature("compat.total", app=app).set(queue="mixed"))
    # get() raises the failed header task's own exception first, as Celery's does.
    with pytest.raises(ValueError, match="header"):
        r.get(timeout=30)
    with pytest.raises(Exception) as failed:  # whichever side polled
        r.get(timeout=30, follow_parents=False)
    # celeriac's ChordError, or Celery's (rebuilt by name) when a Celery worker polled.
    assert "ChordError" in f"{type(failed.value).__name__}: {failed.value}"
    assert "header" in str(failed.value)
    out = fleet.celery.run("r = chord([proj.add.s(1, 1).set(queue='to_celeriac'), "
                           "proj.boom.s('header').set(queue='to_celery')])("
                           "proj.total.s().set(queue='mixed'))\n"
                           "r.get(timeout=30, propagate=False)\n"
                           "out = [r.state, type(r.result).__name__, str(r.result)]", 60)
    assert out[:2] == ["FAILURE", "ChordError"] and "header" in out[2]
