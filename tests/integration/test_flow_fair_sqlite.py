"""Fair queues on the SQLite broker (issue 29), as ``test_flow_fair.py`` has them on
Redis: tenant A enqueues its backlog, then tenant B 100 tasks; all of B's run within the
first 1% of the drain that follows (places from a SQLite file the tasks count in). A real
worker on a SQLite file of the test's own; once B is done the rest of A's backlog is
purged, not drained.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from celeriac import Celeriac
from tests.faults import sqlite_fair_tasks as ft
from tests.integration.support import ROOT, Workers, bound, workers

pytestmark = pytest.mark.slow

A, B = 50_000, 100


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    db, places = tmp_path / "broker.db", tmp_path / "places.db"
    ft.places_db(str(places))
    return {"CELERIAC_BROKER_URL": f"sqlite:///{db}", "CELERIAC_RESULT_BACKEND": f"sqlite:///{db}",
            "CELERIAC_BROKER_FAIR_QUEUES": "fair", "CELERIAC_TASK_DEFAULT_QUEUE": "fair",
            "FAIR_PLACES_DB": str(places), "PYTHONPATH": str(ROOT)}


@pytest.fixture
def app(env: dict[str, str]) -> Iterator[Celeriac]:
    with bound(ft.app, env) as a:
        yield a


@pytest.fixture
def pool(env: dict[str, str], tmp_path: Path) -> Iterator[Workers]:
    with workers("tests.faults.sqlite_fair_tasks", env, tmp_path) as w:
        yield w


def test_a_tenant_with_100_tasks_is_not_starved_on_sqlite(
        app: Celeriac, pool: Workers, env: dict[str, str]) -> None:
    try:
        pool.start("-c", "2", "-Q", "fair")
        began = time.monotonic()
        ft.place.delay_many([("A",)] * A, fair_key="A")
        enqueued = time.monotonic() - began
        # In one batch (Redis's test sends them one by one), and places counted from the
        # moment it is stored (none of B's can run before its one commit): the places then
        # measure the turns alone, not how fast a producer on a loaded machine sends 100
        # messages while A's run.
        mine = ft.place.delay_many([("B",)] * B, fair_key="B")
        before = ft.taken(env["FAIR_PLACES_DB"])  # A's tasks run while A and B enqueued
        places = [r.get(timeout=60) - before for r in mine]
        print(f"\nfair queue on SQLite: A's {A:,} enqueued in {enqueued:.1f}s ({before:,} of "
              f"them ran meanwhile); B's {B} ran at places {min(places)}-{max(places)} of "
              f"the {A + B - before:,} left to drain")
        assert max(places) <= (A + B) // 100, places
    finally:
        app.transport.purge("fair")
