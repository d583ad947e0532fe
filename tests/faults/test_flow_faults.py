"""Flow control when a worker dies (issue 29): ``kill -9`` of a worker holding a unique
job's lock (the job runs again once, elsewhere, and a new ``delay()`` is accepted after
the redelivery), concurrency slots (they come back within its lease) and a task that had
succeeded (not run again, ``worker_deduplicate_successful_tasks``). Real worker
processes, lease 2 s, on each shared store (``tests/integration/flow_stores.py``): Redis;
PostgreSQL results with a Redis broker; SQLite broker and results.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from celeriac import Celeriac
from celeriac.stores import store_for
from celeriac.testing import wait_until
from tests.faults import flow_tasks as ft
from tests.integration.flow_stores import STORES, store_env
from tests.integration.support import Workers, bound, workers

pytestmark = pytest.mark.slow

LEASE = 2.0


# The class each store kind must give: a guard that each case runs on the store it names.
STORE_CLASSES = {"redis": "RedisStore", "postgres": "PostgresStore", "sqlite": "SQLiteStore"}


@pytest.fixture(params=STORES)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def env(kind: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    with store_env(kind, "flf", tmp_path, WORKER_LEASE_TIMEOUT=LEASE,
                   TASK_REDELIVERY_DELAY=0.1) as e:
        yield e


@pytest.fixture
def app(env: dict[str, str]) -> Iterator[Celeriac]:
    with bound(ft.app, env) as a:
        yield a


@pytest.fixture
def pool(env: dict[str, str], tmp_path: Path) -> Iterator[Workers]:
    with workers("tests.faults.flow_tasks", env, tmp_path) as w:
        yield w


def starts(marks: Path, task_id: str) -> int:
    return sum(p.read_text().count("started") for p in marks.iterdir()
               if p.name.endswith(task_id))


def test_kill_9_of_a_worker_holding_a_unique_lock_slots_and_a_task_that_succeeded(
        kind: str, app: Celeriac, pool: Workers, tmp_path: Path) -> None:
    """One worker holds all three when it is killed (one kill, one lease to wait out):
    its concurrency slots come back within its lease; the unique job runs again once,
    elsewhere, and a new ``delay()`` is accepted after its redelivery; the task that had
    succeeded is not run again (``worker_deduplicate_successful_tasks``)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    key, tenant = uuid.uuid4().hex, uuid.uuid4().hex[:8]
    sem = f"conc:{ft.per_tenant.name}:{tenant}"
    dedupe = {"CELERIAC_WORKER_DEDUPLICATE_SUCCESSFUL_TASKS": "true"}
    first = pool.start("-c", "4", extra_env=dedupe)
    job = ft.once.delay(str(marks), key, 2.0)
    done = ft.succeeds_then_hangs.delay(str(marks))
    for _ in range(3):
        ft.per_tenant.delay(str(tmp_path), tenant, 60.0)
    store = store_for(app.settings, "the test")
    assert type(store).__name__ == STORE_CLASSES[kind]
    try:
        wait_until(lambda: starts(marks, job.id) == 1 and starts(marks, done.id) == 1, 20,
                   message="the unique job and the one that succeeds started")
        wait_until(lambda: len(store.slot_holders(sem)) == 2, 20,
                   message="two slots held (the third job waits for one)")
        assert ft.once.delay(str(marks), key, 2.0).id == job.id  # locked while it runs
        first.kill()
        killed = time.monotonic()
        wait_until(lambda: not store.slot_holders(sem), 4 * LEASE + 10,
                   message="the dead worker's slots back")
        back = time.monotonic() - killed
    finally:
        store.close()
    print(f"\n{kind}: concurrency slots of a kill -9'd worker back after {back:.2f}s "
          f"(worker_lease_timeout={LEASE}s)")
    assert back < LEASE + 3.0  # the lease, and room for a loaded machine

    second = pool.start("-c", "4", extra_env=dedupe)
    # Redelivered once the dead worker's lease lapsed: the lock goes with it, and the
    # job runs again, once.
    wait_until(lambda: starts(marks, job.id) == 2, 20, message="the job redelivered")
    fresh = wait_until(lambda: (r := ft.once.delay(str(marks), key, 0.0)).id != job.id
                       and r, 10, message="a new delay() accepted after the redelivery")
    assert job.get(timeout=20) == key and fresh.get(timeout=20) == key
    assert starts(marks, job.id) == 2 and starts(marks, fresh.id) == 1
    second.wait_for_log(rf"{done.id}\] redelivered after it succeeded: not run again", 20)
    assert done.get(timeout=5) == "early" and starts(marks, done.id) == 1
