"""The prefork pool driven directly on an event loop in this process (real children)."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from celeriac import Celeriac
from celeriac.worker.execute import Job, Outcome
from celeriac.worker.pool.base import NullClient
from celeriac.worker.pool.prefork import PreforkPool
from tests.loops import until

pytestmark = pytest.mark.slow


def make_app() -> Celeriac:
    url = f"memory://{uuid.uuid4().hex}"
    app = Celeriac("pool", broker=url, backend=url)

    @app.task(name="pid")
    def pid() -> int:
        return os.getpid()

    return app


async def wait_for(predicate: Callable[[], Any], timeout: float = 10.0) -> None:
    await until(predicate, timeout, 0.01)


class Recorder(NullClient):
    def __init__(self, done: list[tuple[Job, Outcome]]) -> None:
        super().__init__()
        self.done = done

    def on_job_done(self, job: Job, outcome: Outcome) -> None:
        self.done.append((job, outcome))


def test_grow_and_shrink() -> None:
    app = make_app()
    done: list[tuple[Job, Outcome]] = []

    async def main() -> None:
        pool = PreforkPool(app, 1, client=Recorder(done))
        await pool.start()
        await wait_for(lambda: pool.free_slots() == 1)
        pool.grow(2)
        await wait_for(lambda: pool.free_slots() == 3)
        assert len(pool.children) == 3
        pool.shrink(2)
        await wait_for(lambda: len(pool.children) == 1)
        assert pool.concurrency == 1 and pool.free_slots() == 1
        pool.shrink(5)  # never below one child
        assert pool.concurrency == 1
        await pool.stop()
        assert pool.children == {}

    asyncio.run(main())


def test_memory_backend_results_are_relayed_through_the_parent() -> None:
    app = make_app()

    async def main() -> list[int]:
        worker = app.worker(pool="prefork", concurrency=2, install_signal_handlers=False)
        running = asyncio.ensure_future(worker.run_async())
        results = [app.send_task("pid") for _ in range(20)]
        await wait_for(lambda: all(r.ready() for r in results))
        worker.shutdown()
        assert await asyncio.wait_for(running, 10) == 0
        return [r.get(timeout=1) for r in results]

    pids = asyncio.run(main())
    assert os.getpid() not in pids  # ran in the children
    assert 1 <= len(set(pids)) <= 2


def test_a_retry_from_a_child_is_relayed_to_an_in_memory_broker() -> None:
    """A pool child cannot reach a broker in the worker's memory: its app publishes
    through the relay (a ``Publisher``), which the worker applies."""
    app = make_app()

    @app.task(name="twice", bind=True, max_retries=2)
    def twice(self) -> int:  # type: ignore[no-untyped-def]
        if self.request.retries == 0:
            raise self.retry(countdown=0)
        return os.getpid()

    async def main() -> int:
        worker = app.worker(pool="prefork", concurrency=1, install_signal_handlers=False)
        running = asyncio.ensure_future(worker.run_async())
        result = app.send_task("twice")
        await wait_for(result.ready)
        worker.shutdown()
        assert await asyncio.wait_for(running, 10) == 0
        return int(result.get(timeout=1))

    assert asyncio.run(main()) != os.getpid()
