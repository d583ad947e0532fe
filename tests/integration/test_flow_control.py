"""Flow control end to end (issue 29): unique jobs (until finished, until started,
debounce) and concurrency limits per key, with a real worker (prefork, 4 children) on
each store: Redis (broker and store), PostgreSQL (the result backend's store, Redis
broker) and SQLite (broker and store). One worker per store, shared by the module."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from celeriac import Celeriac, Settings, states
from celeriac.errors import TaskRevoked
from celeriac.stores import open_store
from celeriac.testing import WorkerProcess, wait_until
from tests.contracts.conftest import _drop_redis_namespace
from tests.faults import flow_tasks as ft
from tests.integration.support import ROOT, workers
from tests.services import require

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["redis", "postgres", "sqlite"])
def env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[dict[str, str]]:
    ns = f"flw{uuid.uuid4().hex[:10]}"
    redis = f"{require('redis')}?namespace={ns}" if request.param != "sqlite" else ""
    broker = backend = redis
    if request.param == "postgres":
        backend = f"{require('postgres')}?namespace={ns}"
    elif request.param == "sqlite":
        broker = backend = f"sqlite:///{tmp_path_factory.mktemp('db') / 'flow.db'}"
    yield {"CELERIAC_BROKER_URL": broker, "CELERIAC_RESULT_BACKEND": backend,
           "CELERIAC_WORKER_LEASE_TIMEOUT": "2.0", "PYTHONPATH": str(ROOT)}
    if request.param == "postgres":
        store = open_store(Settings(result_backend=backend), backend)
        store.drop()  # type: ignore[attr-defined]
        store.close()
        with psycopg.connect(backend.partition("?")[0], autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(
                sql.Identifier(f"{ns}_results")))
    if redis:
        _drop_redis_namespace(redis)


@pytest.fixture(scope="module")
def app(env: dict[str, str]) -> Iterator[Celeriac]:
    before = ft.app.settings
    ft.app.close()
    ft.app.settings = Settings.from_env(env)
    yield ft.app
    ft.app.close()
    ft.app.settings = before


@pytest.fixture(scope="module")
def worker(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[WorkerProcess]:
    with workers("tests.faults.flow_tasks", env, tmp_path_factory.mktemp("w")) as w:
        yield w.start("-c", "4")


def test_a_unique_job_is_sent_once_while_it_runs_then_again(
        app: Celeriac, worker: WorkerProcess, tmp_path: Path) -> None:
    first = ft.once.delay(str(tmp_path), "a", 0.5)
    again = [ft.once.delay(str(tmp_path), "a", 0.5) for _ in range(3)]
    other = ft.once.delay(str(tmp_path), "b", 0.0)  # other arguments: another key
    assert {r.id for r in again} == {first.id} != {other.id}
    assert first.get(timeout=20) == "a" and other.get(timeout=20) == "b"
    # Finished: the lock went with it (the worker lets it go as the job ends, after
    # its result: wait for that rather than race it).
    after = wait_until(lambda: (r := ft.once.delay(str(tmp_path), "a", 0.0)).id != first.id
                       and r, 10, message="the lock released after the job ended")
    assert after.get(timeout=20) == "a"
    assert sorted(len(p.read_text().split()) for p in tmp_path.iterdir()) == [1, 1, 1]


def test_until_started_lets_a_second_in_once_the_first_runs(
        app: Celeriac, worker: WorkerProcess, tmp_path: Path) -> None:
    key = uuid.uuid4().hex
    # Delayed a moment, so that it is still queued when the second call comes.
    first = ft.once_queued.apply_async((str(tmp_path), key, 1.0), countdown=0.5)
    assert ft.once_queued.delay(str(tmp_path), key, 1.0).id == first.id
    wait_until(lambda: any(tmp_path.iterdir()), 20, message="the first started")
    second = wait_until(lambda: (r := ft.once_queued.delay(str(tmp_path), key, 0.0)).id
                        != first.id and r, 10, message="the lock released at the start")
    assert second.get(timeout=20) == key and first.get(timeout=20) == key


def test_debounce_runs_the_last_call_and_revokes_the_others(
        app: Celeriac, worker: WorkerProcess, tmp_path: Path) -> None:
    key = uuid.uuid4().hex
    calls = [ft.debounced.delay(str(tmp_path), key, i) for i in range(4)]
    assert len({r.id for r in calls}) == 4
    assert calls[-1].get(timeout=20) == 3
    for r in calls[:-1]:
        with pytest.raises(TaskRevoked):
            r.get(timeout=20)
        assert r.state == states.REVOKED
    assert [p.name.split("-", 1)[1] for p in tmp_path.iterdir()] == [calls[-1].id]


def test_concurrency_per_key_is_never_passed_and_nothing_is_dropped(
        app: Celeriac, worker: WorkerProcess, tmp_path: Path) -> None:
    results = [ft.per_tenant.delay(str(tmp_path), tenant, 0.3)
               for _ in range(5) for tenant in ("t1", "t2")]
    assert sorted(r.get(timeout=30) for r in results) == ["t1"] * 5 + ["t2"] * 5
    assert ft.most_at_once(str(tmp_path), "t1") <= 2
    assert ft.most_at_once(str(tmp_path), "t2") <= 2
    # Four children and two tenants of two: both ran two at once at some point.
    assert ft.most_at_once(str(tmp_path), "t1") + ft.most_at_once(str(tmp_path), "t2") >= 3
