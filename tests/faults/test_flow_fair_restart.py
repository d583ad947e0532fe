"""A fair queue through a Redis restart (issue 29): 3,000 tasks of three fair keys on a
Redis of the test's own (AOF, appendfsync always, on another port), restarted while a
worker drains them: every task completes, and the keys still alternate after it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from celeriac import Celeriac, Settings
from celeriac.testing import wait_until
from tests.faults import flow_tasks as ft
from tests.faults import test_broker_faults
from tests.integration.support import ROOT, workers

pytestmark = pytest.mark.slow

own_redis = test_broker_faults.own_redis  # the fixture: a Redis of this test's own
PER_KEY = 1000
"""Enough that the restart comes mid-drain on a fast machine too: with 300 a key, a
worker drained the rest before Redis had stopped, and never saw the restart."""


@pytest.fixture
def env(own_redis: Callable[[], None]) -> dict[str, str]:
    url = f"redis://127.0.0.1:{own_redis.port}/0?namespace=f{uuid.uuid4().hex[:8]}"  # type: ignore[attr-defined]
    return {"CELERIAC_BROKER_URL": url, "CELERIAC_RESULT_BACKEND": url,
            "CELERIAC_BROKER_FAIR_QUEUES": "fair", "CELERIAC_TASK_DEFAULT_QUEUE": "fair",
            "CELERIAC_WORKER_LEASE_TIMEOUT": "2.0", "PYTHONPATH": str(ROOT)}


@pytest.fixture
def app(env: dict[str, str]) -> Iterator[Celeriac]:
    before = ft.app.settings
    ft.app.close()
    ft.app.settings = Settings.from_env(env)
    yield ft.app
    ft.app.close()
    ft.app.settings = before


def test_redis_restart_under_a_fair_queue_loses_nothing(
        app: Celeriac, env: dict[str, str], own_redis: Callable[[], None],
        tmp_path: Path) -> None:
    sent = {key: ft.fair_work.delay_many([(key,)] * PER_KEY, fair_key=key)
            for key in ("a", "b", "c")}
    with workers("tests.faults.flow_tasks", env, tmp_path) as pool:
        w = pool.start("-c", "2", "-Q", "fair")
        wait_until(lambda: sum(r.ready() for r in sent["c"][:60]) >= 30, 30,
                   message="the drain under way")
        own_redis()
        ids = [r.id for results in sent.values() for r in results]
        done = app.backend.wait_for(ids, timeout=120)
        assert len(done) == len(ids), f"{len(ids) - len(done)} missing:\n{w.log[-3000:]}"
        assert "connection restored" in w.log, w.log[-3000:]
    # In turn across the keys, before and after the restart: no key's last task ran far
    # behind another's (at most the prefetch and the restart's redeliveries apart).
    assert all(m.state == "SUCCESS" for m in done.values())
    places = {key: max(done[r.id].result for r in results) for key, results in sent.items()}
    assert max(places.values()) - min(places.values()) < 200, places
