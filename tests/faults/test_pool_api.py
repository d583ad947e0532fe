"""The prefork pool driven directly on an event loop in this process (real children)."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from celeriac import Celeriac
from celeriac.worker.execute import Job, Outcome
from celeriac.worker.pool import prefork
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


def _job(seq: int, task: str, *args: Any) -> Job:
    headers: dict[str, Any] = {"task": task, "id": f"job-{uuid.uuid4()}",
                               "timelimit": [None, None]}
    return Job(seq, headers, orjson.dumps([list(args), {}, {}]), "application/json",
               "celery", 1, "test@host")


@pytest.mark.parametrize("grace", [30.0, 0.05])
def test_a_job_queued_behind_a_short_task_stays_there(monkeypatch: pytest.MonkeyPatch,
                                                       grace: float) -> None:
    """A job in a child's pipe behind a task that started less than ``RECALL_AFTER`` ago
    is not recalled when another child falls idle: that task ends first and its child
    runs the job (a recall would cost more than it saves). Behind a task that runs
    longer, the idle child gets it."""
    monkeypatch.setattr(prefork, "RECALL_AFTER", grace)
    app = make_app()

    @app.task(name="nap")
    def nap(seconds: float) -> int:
        time.sleep(seconds)  # sleep-ok: the task's own work
        return os.getpid()

    done: list[tuple[Job, Outcome]] = []

    async def main() -> dict[int, int]:
        pool = PreforkPool(app, 2, client=Recorder(done))
        await pool.start()
        await wait_for(lambda: pool.free_slots() == 2)
        # 1 runs on one child, 2 on the other; 3 waits in the first one's pipe.
        for seq, seconds in ((1, 0.3), (2, 0.0), (3, 0.0)):
            pool.submit(_job(seq, "nap", seconds))
        first = next(c for c in pool.children.values() if c.job and c.job.seq == 1)
        assert first.queued is not None and first.queued.seq == 3
        await wait_for(lambda: len(done) == 3, timeout=30)
        await pool.stop()
        return {job.seq: orjson.loads(outcome.stored.data)["result"]
                for job, outcome in done if outcome.stored is not None}

    pids = asyncio.run(main())
    order = [job.seq for job, _ in done]
    if grace > 1:  # behind the short task: no recall, it ran there, after it
        assert pids[3] == pids[1] and order.index(3) > order.index(1)
    else:  # recalled: it ran on the idle child while the long task still ran
        assert pids[3] == pids[2] and order.index(3) < order.index(1)
