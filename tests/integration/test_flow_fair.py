"""Fair queues (issue 29): a queue declared fair (``broker_fair_queues``) is taken in turn
across fair keys. Tenant A enqueues 50,000 tasks, then tenant B 100: all of B's run
within the first 1% of the drain that follows (positions from a Redis counter the tasks
increment as they run). A real worker on a namespace of the shared Redis; once B is done
the rest of A's backlog is purged, not drained.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celeriac import Celeriac
from tests.faults import flow_tasks as ft
from tests.integration.support import Workers, bound, redis_env, workers

pytestmark = pytest.mark.slow

A, B = 50_000, 100


@pytest.fixture
def env() -> Iterator[dict[str, str]]:
    with redis_env("flq", BROKER_FAIR_QUEUES="fair", TASK_DEFAULT_QUEUE="fair") as e:
        yield e


@pytest.fixture
def app(env: dict[str, str]) -> Iterator[Celeriac]:
    with bound(ft.app, env) as a:
        yield a


@pytest.fixture
def pool(env: dict[str, str], tmp_path: Path) -> Iterator[Workers]:
    with workers("tests.faults.flow_tasks", env, tmp_path) as w:
        yield w


def test_a_tenant_with_100_tasks_is_not_starved_by_one_with_50000(
        app: Celeriac, pool: Workers, env: dict[str, str]) -> None:
    counter = redis.Redis.from_url(env["CELERIAC_BROKER_URL"].partition("?")[0])
    key = f"{env['NAMESPACE']}:fairpos"
    try:
        pool.start("-c", "2", "-Q", "fair")
        began = time.monotonic()
        ft.fair_work.delay_many([("A",)] * A, fair_key="A")
        enqueued = time.monotonic() - began
        before = int(counter.get(key) or 0)  # A's tasks run while A enqueued
        mine = [ft.fair_work.apply_async(("B",), fair_key="B") for _ in range(B)]
        places = [r.get(timeout=60) - before for r in mine]
        print(f"\nfair queue: A's {A:,} enqueued in {enqueued:.1f}s ({before:,} of them ran "
              f"meanwhile); B's {B} ran at places {min(places)}-{max(places)} of the "
              f"{A + B - before:,} left to drain")
        assert max(places) <= (A + B) // 100, places
    finally:
        app.transport.purge("fair")
        counter.close()


def test_fair_key_is_refused_for_a_queue_not_declared_fair(app: Celeriac) -> None:
    with pytest.raises(ValueError, match="fair_key: queue 'plain' is not fair"):
        ft.fair_work.apply_async(("x",), queue="plain", fair_key="x")
    with pytest.raises(ValueError, match="fair_key must be a string"):
        ft.fair_work.apply_async(("x",), queue="fair", fair_key=42)  # type: ignore[arg-type]
