"""The pool contract: what the consumer may rely on, for every execution pool.

Each test drives a pool directly on an event loop, as the consumer does: jobs are
submitted while ``free_slots() + queue_slots() > 0``, outcomes come back through
``on_job_done``, jobs handed back through ``on_job_returned`` go first in line again. Prefork
runs real children; solo runs its executor thread; threads its threads. Every test runs
with sync tasks and with ``async def`` tasks (``-async`` ids), which prefork runs several
at once on each child's loop. ``test_pool_async.py`` holds what only async tasks do.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections import deque
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from celeriac import Celeriac
from celeriac.worker.execute import Job, Outcome
from celeriac.worker.pool import POOLS
from celeriac.worker.pool.base import Pool
from tests.loops import until

pytestmark = pytest.mark.slow

POOL_NAMES = sorted(POOLS)
VARIANTS = [pytest.param(name, kind, id=f"{name}-{kind}") for name in POOL_NAMES
            for kind in ("sync", "async")]


@pytest.fixture
def app() -> Iterator[Celeriac]:
    url = f"memory://{uuid.uuid4().hex}"
    app = Celeriac("pools", broker=url, backend=url)

    @app.task(name="nap")
    def nap(seconds: float) -> int:
        import time

        time.sleep(seconds)  # sleep-ok: the task's own work
        return os.getpid()

    @app.task(name="anap")
    async def anap(seconds: float) -> int:
        await asyncio.sleep(seconds)  # sleep-ok: the job's own work
        return os.getpid()

    yield app
    app.close()


class Consumer:
    """The consumer's side of the contract, and nothing else."""

    def __init__(self, app: Celeriac, name: str, concurrency: int, kind: str = "sync") -> None:
        self.task = "anap" if kind == "async" else "nap"
        self.done: dict[int, Outcome] = {}
        self.order: list[int] = []
        self.reserved: deque[Job] = deque()
        self.started: list[int] = []
        self.stopping = False
        self.seq = 0
        self.pool: Pool = POOLS[name](app, concurrency)
        self.pool.attach(self)

    def on_job_done(self, job: Job, outcome: Outcome) -> None:
        self.done[job.seq] = outcome
        self.order.append(job.seq)
        self.dispatch()

    def on_slot(self) -> None:
        self.dispatch()

    def on_job_started(self, job: Job) -> None:
        self.started.append(job.seq)

    def on_job_returned(self, job: Job) -> None:
        self.reserved.appendleft(job)
        self.dispatch()

    def on_job_progress(self, task_id: str, state: str, meta: Any) -> None:
        pass

    def on_fatal(self, reason: str) -> None:
        pass

    def dispatch(self) -> None:
        pool = self.pool
        while not self.stopping and self.reserved and (pool.free_slots() or pool.queue_slots()):
            pool.submit(self.reserved.popleft())

    def send(self, *seconds: float, task: str | None = None, timelimit: Any = (None, None)
             ) -> list[int]:
        seqs = []
        for s in seconds:
            self.seq += 1
            seq = self.seq
            headers: dict[str, Any] = {"task": task or self.task, "id": f"job-{uuid.uuid4()}",
                                       "timelimit": list(timelimit)}
            self.reserved.append(Job(seq, headers, orjson.dumps([[s], {}, {}]),
                                     "application/json", "celery", 1, "test@host"))
            seqs.append(seq)
        self.dispatch()
        return seqs

    def result(self, seq: int) -> Any:
        """The stored result of a job done (Celery's result format)."""
        stored = self.done[seq].stored
        assert stored is not None
        return orjson.loads(stored.data)["result"]

    async def wait(self, seqs: list[int], timeout: float = 10.0) -> None:
        await until(lambda: all(s in self.done for s in seqs), timeout,
                    message=f"jobs {seqs} done")


async def started(c: Consumer) -> None:
    await c.pool.start()
    await until(lambda: c.pool.free_slots() >= c.pool.concurrency, 10, message="pool up")


@pytest.mark.parametrize(("name", "kind"), VARIANTS)
def test_every_job_is_reported_once_with_its_result(app: Celeriac, name: str, kind: str
                                                       ) -> None:
    async def main() -> Consumer:
        c = Consumer(app, name, 2, kind)
        await started(c)
        seqs = c.send(*[0.0] * 50)
        await c.wait(seqs)
        await c.pool.join()
        assert c.pool.running() == []
        await c.pool.stop()
        return c

    c = asyncio.run(main())
    assert sorted(c.order) == sorted(c.done) and len(c.order) == 50  # once each
    assert all(o.action == "ack" and o.state == "SUCCESS" and o.stored is not None
               for o in c.done.values())
    assert sorted(c.started) == sorted(c.done)  # each reported started, once


@pytest.mark.parametrize(("name", "kind"), VARIANTS)
def test_a_long_job_holds_no_short_one_back_while_a_slot_is_free(
        app: Celeriac, name: str, kind: str) -> None:
    if name == "solo":
        pytest.skip("one slot: nothing can run beside the long job")

    async def main() -> tuple[Consumer, list[int], list[int]]:
        c = Consumer(app, name, 2, kind)
        await started(c)
        [long] = c.send(2.0)
        short = c.send(*[0.001] * 40)
        await c.wait(short, timeout=1.8)
        assert long not in c.done  # all the short ones while the long one ran
        await c.wait([long])
        await c.pool.stop()
        return c, [long], short

    c, _, short = asyncio.run(main())
    assert all(s in c.done for s in short)


@pytest.mark.parametrize(("name", "kind"), VARIANTS)
def test_recall_queued_hands_back_every_job_not_started(app: Celeriac, name: str, kind: str
                                                       ) -> None:
    async def main() -> Consumer:
        c = Consumer(app, name, 2, kind)
        await started(c)
        running = c.send(*[0.5] * c.pool.concurrency)
        c.send(0.0, 0.0, 0.0, 0.0)  # into queue slots, if the pool has them
        c.stopping = True  # as a warm stop: nothing more is dispatched
        await c.pool.recall_queued()
        await c.wait(running)
        await c.pool.join()
        assert c.pool.running() == []
        await c.pool.stop()
        return c

    c = asyncio.run(main())
    if kind == "async" and name != "solo":
        # Async jobs start as they come while a loop has room: none waits to be recalled.
        assert len(c.done) == c.pool.concurrency + 4 and not c.reserved
    else:
        assert len(c.done) == c.pool.concurrency and len(c.reserved) == 4  # never ran


@pytest.mark.parametrize(("name", "kind"), VARIANTS)
def test_terminate_abandons_running_jobs_without_reporting_them(
        app: Celeriac, name: str, kind: str) -> None:
    async def main() -> Consumer:
        c = Consumer(app, name, 2, kind)
        await started(c)
        c.send(5.0, 5.0, 5.0 if kind == "async" else 0.0)
        await until(lambda: len(c.started) >= c.pool.concurrency, 5, message="all started")
        loop = asyncio.get_running_loop()
        began = loop.time()
        await c.pool.terminate()
        assert loop.time() - began < 3
        return c

    c = asyncio.run(main())
    assert c.done == {}  # the consumer gives their messages back itself
