"""Results in the tables of Celery's SQLAlchemy backend on MariaDB/MySQL
(``db+mysql://``): a Celery worker's results read by celeriac and a celeriac worker's by
a Celery client, failures and extended fields included; saved groups restored by the
other side; chords completed by ``celery.chord_unlock`` whichever side polls. Celery
makes the tables first, as in a running deployment (on MariaDB its ids come from
sequences). The broker is Redis in kombu's layout (database 12); the tables live in the
database ``celeriac_compat_mysql``.

Celery reaches MySQL through SQLAlchemy and a driver of its own: PyMySQL
(``db+mysql+pymysql://``), installed into the Celery virtualenv here when it lacks it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest
import redis

from celeriac import Celeriac, GroupResult, group, signature
from tests.compat.conftest import CeleryError, counted_chords
from tests.services import require

pytestmark = pytest.mark.slow

DB = 12
BROKER = f"redis://127.0.0.1:6379/{DB}"
DATABASE = "celeriac_compat_mysql"
OURS = f"db+mysql://root@127.0.0.1:3306/{DATABASE}"
THEIRS = f"db+mysql+pymysql://root@127.0.0.1:3306/{DATABASE}"


def _with_pymysql(venv: Path) -> None:
    python = str(venv / "bin" / "python")
    if subprocess.run([python, "-c", "import pymysql"], capture_output=True).returncode:
        subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "PyMySQL>=1.1"], check=True, capture_output=True, timeout=300)


def _database(statement: str) -> None:
    conn = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(statement)
    finally:
        conn.close()


@pytest.fixture(scope="module")
def database() -> Iterator[None]:
    require("mysql")
    _database(f"DROP DATABASE IF EXISTS {DATABASE}")
    _database(f"CREATE DATABASE {DATABASE}")
    yield
    _database(f"DROP DATABASE IF EXISTS {DATABASE}")


@pytest.fixture(scope="module")
def fleet(database: None, fleet_factory: Any) -> Any:
    require("redis")
    _with_pymysql(fleet_factory.venv)
    redis.Redis(db=DB).flushdb()
    theirs = {"COMPAT_BROKER": BROKER, "COMPAT_BACKEND": THEIRS, "COMPAT_EXTENDED": "1",
              "COMPAT_COUNTER": BROKER}
    ours = {"COMPAT_BROKER": f"{BROKER}?layout=kombu", "COMPAT_BACKEND": OURS,
            "COMPAT_EXTENDED": "1", "COMPAT_COUNTER": BROKER}
    fleet_factory.celery = fleet_factory.client(theirs)
    fleet_factory.celery.run("proj.app.backend.ResultSession(); out = 1")
    fleet_factory.celery_worker(theirs, "my-celery", "to_celery,mixed")
    fleet_factory.celeriac_worker(ours, "my-celeriac", "to_celeriac,mixed", "-c", "1")
    return fleet_factory


@pytest.fixture(scope="module")
def app(fleet: Any) -> Iterator[Celeriac]:
    app = Celeriac("compat-mysql", broker=f"{BROKER}?layout=kombu", backend=OURS,
                   result_extended=True)
    yield app
    app.close()


def test_each_side_reads_the_others_results(app: Celeriac, fleet: Any) -> None:
    r = app.send_task("compat.who", ["my"], queue="to_celery")
    assert r.get(timeout=20) == ["celery", "my"]
    assert r.name == "compat.who" and r.args == ["my"]
    with pytest.raises(ValueError, match="broken"):
        app.send_task("compat.boom", ["broken"], queue="to_celery").get(timeout=20)
    out = fleet.celery.run("r = proj.who.apply_async(('my',), queue='to_celeriac')\n"
                           "out = [r.get(timeout=20), r.name, r.args, r.worker]")
    assert out[0] == ["celeriac", "my"] and out[1] == "compat.who" and out[2] == ["my"]
    assert out[3].startswith("my-celeriac@")
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
    ours, code = counted_chords(app, 2, 4, "my")
    out = fleet.celery.run(code, 90)
    assert out == [4 * n + 6 for n in range(2)]
    assert [r.get(timeout=60) for r in ours] == [4 * n + 6 for n in range(2)]
    runs = redis.Redis(db=DB).mget([f"my:{side}:{n}" for side in ("ours", "theirs")
                                    for n in range(2)])
    assert runs == [b"1"] * 4
