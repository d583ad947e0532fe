"""A unique job's lock is let go only once its result is stored: a workflow step's
stand-in (``producer/flow.py``, ``awaited``) reads "lock gone, no result" as "the holder
will never answer" and runs the step itself. The worker stores results at the pump's next
turn, after the job's end; its lock used to be let go at the job's end, and a loaded CI
machine ran a failed holder's step (tests/integration/test_unique_followups.py)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from celeriac import Celeriac, Settings
from celeriac.producer import flow as _flow
from celeriac.stores import open_store
from celeriac.testing import ThreadedWorker, wait_until
from tests.contracts.conftest import _drop_redis_namespace
from tests.services import require

pytestmark = pytest.mark.slow


@pytest.fixture
def app() -> Iterator[Celeriac]:
    ns = f"ulo{uuid.uuid4().hex[:10]}"
    broker = f"{require('redis')}?namespace={ns}"
    # Results in PostgreSQL: the worker stores them in a call of their own (a thread),
    # which this test can hold up.
    backend = f"{require('postgres')}?namespace={ns}"
    app = Celeriac("ulo", settings=Settings(broker_url=broker, result_backend=backend))
    yield app
    app.close()
    store = open_store(Settings(result_backend=backend), backend)
    store.drop()  # type: ignore[attr-defined]
    store.close()
    with psycopg.connect(backend.partition("?")[0], autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(f"{ns}_results")))
    _drop_redis_namespace(broker)


def test_the_lock_outlives_the_job_until_its_result_is_stored(app: Celeriac) -> None:
    @app.task(name="ulo.job", unique_for=60)
    def job(x: int) -> int:
        return x

    backend = app.backend
    store_many = backend.store_many
    storing, go = threading.Event(), threading.Event()

    def held_store_many(results: Any) -> Any:
        storing.set()
        assert go.wait(20), "the test never let the store go"
        return store_many(results)

    backend.store_many = held_store_many  # type: ignore[method-assign]
    lock = _flow.lock_name("ulo.job", (1,), {}, None)
    store = _flow._store(app, "ulo.job")
    with ThreadedWorker(app):
        result = job.delay(1)
        assert storing.wait(20), "the worker never stored the result"
        # The job has ended and its result is on its way: the lock stays its own (the
        # release, were it sent now, would land within milliseconds).
        until = time.monotonic() + 1.0
        while time.monotonic() < until:
            assert store.holder(lock) == result.id, "let go before its result was stored"
            time.sleep(0.02)  # sleep-ok: the poll's interval while the lock must hold
        go.set()
        assert result.get(timeout=20) == 1
        wait_until(lambda: store.holder(lock) is None, 20, message="the lock let go")
