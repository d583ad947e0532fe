"""Results in the tables of Celery's SQLAlchemy backend on PostgreSQL
(``db+postgresql://``): a Celery worker's results read by celeriac and a celeriac
worker's read by a Celery client, failures and extended fields included. The broker is
Redis in kombu's layout (database 6); the tables live in database ``celeriac_compat``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import redis

from celeriac import Celeriac
from tests.compat.conftest import CeleryError
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
    theirs = {"COMPAT_BROKER": BROKER, "COMPAT_BACKEND": RESULTS, "COMPAT_EXTENDED": "1"}
    ours = {"COMPAT_BROKER": f"{BROKER}?layout=kombu", "COMPAT_BACKEND": RESULTS,
            "COMPAT_EXTENDED": "1"}
    # Celery creates its tables first (as in a running deployment).
    fleet_factory.celery = fleet_factory.client(theirs)
    fleet_factory.celery.run("proj.app.backend.ResultSession(); out = 1")
    fleet_factory.celery_worker(theirs, "pg-celery", "to_celery")
    fleet_factory.celeriac_worker(ours, "pg-celeriac", "to_celeriac", "-c", "1")
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
