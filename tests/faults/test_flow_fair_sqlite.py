"""A fair queue on the SQLite broker through a worker's crash (issue 29): 1,500 tasks of
three fair keys, the worker draining them killed with SIGKILL (its whole process group)
while it holds messages; a second worker takes those back when the first's lease lapses:
every task completes, and the keys still alternate after it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from celeriac import Celeriac
from celeriac.testing import wait_until
from tests.faults import sqlite_fair_tasks as ft
from tests.integration.support import ROOT, bound, workers

pytestmark = pytest.mark.slow

PER_KEY = 500


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    db, places = tmp_path / "broker.db", tmp_path / "places.db"
    ft.places_db(str(places))
    return {"CELERIAC_BROKER_URL": f"sqlite:///{db}", "CELERIAC_RESULT_BACKEND": f"sqlite:///{db}",
            "CELERIAC_BROKER_FAIR_QUEUES": "fair", "CELERIAC_TASK_DEFAULT_QUEUE": "fair",
            "CELERIAC_WORKER_LEASE_TIMEOUT": "2.0", "FAIR_PLACES_DB": str(places),
            "PYTHONPATH": str(ROOT)}


@pytest.fixture
def app(env: dict[str, str]) -> Iterator[Celeriac]:
    with bound(ft.app, env) as a:
        yield a


def owned(env: dict[str, str]) -> int:
    conn = sqlite3.connect(env["CELERIAC_BROKER_URL"].removeprefix("sqlite:///"), timeout=30)
    try:
        return int(conn.execute(
            "SELECT count(*) FROM messages WHERE owner IS NOT NULL").fetchone()[0])
    finally:
        conn.close()


def test_a_worker_killed_mid_drain_of_a_fair_queue_loses_nothing(
        app: Celeriac, env: dict[str, str], tmp_path: Path) -> None:
    sent = {key: ft.place.delay_many([(key,)] * PER_KEY, fair_key=key)
            for key in ("a", "b", "c")}
    total = 3 * PER_KEY
    with workers("tests.faults.sqlite_fair_tasks", env, tmp_path) as pool:
        first = pool.start("-c", "2", "-Q", "fair")
        wait_until(lambda: ft.taken(env["FAIR_PLACES_DB"]) >= 200, 60,
                   message="the drain under way")
        first.kill()
        ran = ft.taken(env["FAIR_PLACES_DB"])
        held = owned(env)
        assert ran < total and held > 0, (ran, held)  # killed mid-drain, holding messages
        second = pool.start("-c", "2", "-Q", "fair")
        ids = [r.id for results in sent.values() for r in results]
        done = app.backend.wait_for(ids, timeout=120)
        assert len(done) == len(ids), f"{len(ids) - len(done)} missing:\n{second.log[-3000:]}"
        assert "of dead consumers to their queues" in second.log, second.log[-3000:]
        # A result is stored before its message is acked (in the same turn): wait for it.
        wait_until(lambda: owned(env) == 0, 30, message="every message acked")
    assert all(m.state == "SUCCESS" for m in done.values())
    assert app.transport.queue_length("fair") == 0
    # In turn across the keys, before and after the crash: no key's last task ran far
    # behind another's (at most the prefetch and the crash's redeliveries apart).
    places = {key: max(done[r.id].result for r in results) for key, results in sent.items()}
    assert max(places.values()) - min(places.values()) < 200, places
