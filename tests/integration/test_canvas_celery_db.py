"""The canvas suite on Celery's database layout (``db+postgresql://``, broker SQLite):
results in ``celery_taskmeta``, saved groups in ``celery_tasksetmeta``, and chords
completed as Celery completes them there, by a ``celery.chord_unlock`` task that polls
the header's results (``test_postgres_interop.py`` mixes in Celery's own workers).

Celery's table names are fixed, so this module has a database of its own."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

from celeriac import Celeriac, GroupResult, chord
from celeriac.testing import WorkerProcess, wait_until
from tests.integration import app_tasks as t
from tests.integration.test_canvas_worker import *  # noqa: F403 - the tests and fixtures
from tests.services import require

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    server = require("postgres").rsplit("/", 1)[0]
    name = f"celeriac_canvas_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield f"{server}/{name}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def env(module_env: dict[str, str], database: str) -> dict[str, str]:
    """The module's: its tests share one worker (``shared_worker``)."""
    return {**module_env, "CELERIAC_RESULT_BACKEND": "db+" + database,
            "CELERIAC_RESULT_CHORD_RETRY_INTERVAL": "0.2"}


def test_chords_are_polled_by_chord_unlock_not_counted(
        app: Celeriac, worker: WorkerProcess, database: str) -> None:
    r = chord(t.add.s(i, i) for i in range(5))(t.total.s())
    assert r.get(timeout=20) == 20
    with psycopg.connect(database) as conn:
        # Nothing counted the header (Celery workers would not either); the body's claim
        # is the one row of celeriac's tables, and the group is Celery's row.
        assert conn.execute("SELECT count(*) FROM celeriac_chord_parts WHERE group_id = %s",
                            (r.parent.id,)).fetchone() == (0,)
        row = conn.execute("SELECT result FROM celery_tasksetmeta WHERE taskset_id = %s",
                           (r.parent.id,)).fetchone()
    assert row is not None
    saved = GroupResult.restore(r.parent.id, app=app)
    assert saved is not None and [x.id for x in saved.results] == [
        x.id for x in r.parent.results]
    saved.delete()
    assert GroupResult.restore(r.parent.id, app=app) is None


def test_chord_unlock_waits_for_a_slow_header(app: Celeriac, worker: WorkerProcess) -> None:
    r = chord([t.sleep.s(1.5), t.add.s(1, 1)], t.total.s()).apply_async()
    wait_until(lambda: app.AsyncResult(r.parent.results[1].id).ready(), 15,
               message="the fast header task done")
    assert not r.ready()  # the unlock task is still polling: the slow one runs
    assert r.get(timeout=20) == 3.5
