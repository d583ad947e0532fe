"""The pool contract for ``async def`` tasks: what only they do.

Driven as ``test_pool_contract.py`` drives the pools (its ``Consumer``): results,
failures and retries; time limits (soft raised at the await, hard cancelling, and a
blocking task's child killed with its other jobs handed back uncounted); a child killed
with 50 async jobs in flight (every one comes back); recycling that waits for the jobs in
flight; fairness between sync and async jobs on prefork.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Iterator

import pytest

from celeriac import Celeriac, SoftTimeLimitExceeded
from tests.contracts.test_pool_contract import Consumer, started
from tests.loops import until

pytestmark = pytest.mark.slow

ASYNC_POOLS = ["prefork", "threads", "solo"]


@pytest.fixture
def app() -> Iterator[Celeriac]:
    url = f"memory://{uuid.uuid4().hex}"
    app = Celeriac("apools", broker=url, backend=url, worker_child_concurrency=60,
                   worker_async_kill_grace=0.3, task_redelivery_delay=0.1)

    @app.task(name="anap")
    async def anap(seconds: float) -> int:
        await asyncio.sleep(seconds)  # sleep-ok: the job's own work
        return os.getpid()

    @app.task(name="nap")
    def nap(seconds: float) -> int:
        time.sleep(seconds)  # sleep-ok: the task's own work
        return os.getpid()

    @app.task(name="aboom")
    async def aboom(seconds: float) -> None:
        await asyncio.sleep(seconds)  # sleep-ok: the job's own work
        raise ValueError("async failure")

    @app.task(name="aretry", bind=True, max_retries=2)
    async def aretry(self, seconds: float) -> None:  # type: ignore[no-untyped-def]
        raise self.retry(countdown=60)

    @app.task(name="asoft")
    async def asoft(seconds: float) -> str:
        try:
            await asyncio.sleep(seconds)  # sleep-ok: the job's own work
        except SoftTimeLimitExceeded:
            await asyncio.sleep(0)  # sleep-ok: cleanup may await
            return "cleaned up"
        return "not interrupted"

    @app.task(name="ablock")
    async def ablock(seconds: float) -> int:
        time.sleep(seconds)  # sleep-ok: the blocking code the limit is about
        return os.getpid()

    yield app
    app.close()


def run(app: Celeriac, name: str, concurrency: int, body: object) -> Consumer:
    async def main() -> Consumer:
        c = Consumer(app, name, concurrency, "async")
        await started(c)
        try:
            await body(c)  # type: ignore[operator]
        finally:
            await c.pool.terminate()
        return c

    return asyncio.run(main())


@pytest.mark.parametrize("name", ASYNC_POOLS)
def test_results_failures_retries_and_soft_limits(app: Celeriac, name: str) -> None:
    async def body(c: Consumer) -> None:
        ok = c.send(0.01, 0.01)
        [failed] = c.send(0.0, task="aboom")
        [retried] = c.send(0.0, task="aretry")
        [soft] = c.send(0.5 if name == "solo" else 5.0, task="asoft", timelimit=(None, 0.2))
        await c.wait([*ok, failed, retried, soft])
        assert [c.done[s].state for s in ok] == ["SUCCESS", "SUCCESS"]
        assert c.done[failed].state == "FAILURE"
        assert c.result(failed)["exc_type"] == "ValueError"
        assert c.done[retried].state == "RETRY"
        if name != "solo":  # solo enforces no time limits, for any task
            assert (c.done[soft].state, c.result(soft)) == ("SUCCESS", "cleaned up")
            assert c.done[soft].runtime < 2

    run(app, name, 2, body)


@pytest.mark.parametrize("name", ["prefork", "threads"])
def test_hard_limit_cancels_an_async_task_at_its_await(app: Celeriac, name: str) -> None:
    async def body(c: Consumer) -> None:
        [over] = c.send(5.0, timelimit=(0.3, None))
        others = c.send(*[0.5] * 10)
        await c.wait([over, *others])
        assert c.done[over].state == "FAILURE"
        assert c.result(over)["exc_type"] == "TimeLimitExceeded"
        assert c.done[over].runtime < 1.0
        assert {c.done[s].state for s in others} == {"SUCCESS"}

    run(app, name, 2, body)


def test_blocking_task_over_its_hard_limit_kills_its_child_alone_failing(
        app: Celeriac) -> None:
    async def body(c: Consumer) -> None:
        [blocker] = c.send(3.0, task="ablock", timelimit=(0.3, None))
        others = c.send(*[0.5] * 20)  # spread over both children, blocked ones included
        await c.wait([blocker, *others], timeout=15)
        assert c.done[blocker].state == "FAILURE"
        assert c.result(blocker)["exc_type"] == "TimeLimitExceeded"
        assert c.done[blocker].reason == "hard time limit"
        # Killed at 0.3 + 0.3 s grace; the jobs it held ran again, uncounted (handed
        # back to the consumer, not lost).
        assert {c.done[s].state for s in others} == {"SUCCESS"}

    c = run(app, "prefork", 2, body)
    assert not any(o.action == "requeue" for o in c.done.values())


def test_kill_9_of_a_child_with_50_async_jobs_in_flight_loses_none(app: Celeriac) -> None:
    app.settings = app.settings.replace(worker_child_concurrency=50)

    async def body(c: Consumer) -> None:
        seqs = c.send(*[3.0] * 100)  # 2 children x 50
        pool = c.pool
        await until(lambda: len(c.started) >= 100, 5, 0.01, message="100 jobs started")
        victim = next(p for p in pool.children.values() if len(p.tasks) == 50)  # type: ignore[attr-defined]
        os.kill(victim.pid, signal.SIGKILL)
        await c.wait(seqs, timeout=10)
        lost = [s for s in seqs if c.done[s].action == "requeue"]
        assert len(lost) == 50  # each goes back to the broker (redelivered, counted)
        assert all("SIGKILL" in (c.done[s].reason or "") for s in lost)
        assert sum(1 for s in seqs if c.done[s].state == "SUCCESS") == 50

    run(app, "prefork", 2, body)


def test_recycling_waits_for_the_async_jobs_in_flight(app: Celeriac) -> None:
    app.settings = app.settings.replace(worker_max_tasks_per_child=10)

    async def body(c: Consumer) -> None:
        first = c.send(*[0.3] * 30)  # a child recycles after 10, with ~20 in flight
        await c.wait(first, timeout=10)
        await started(c)  # its replacement is up
        second = c.send(*[0.3] * 30)
        await c.wait(second, timeout=10)
        seqs = first + second
        assert {c.done[s].state for s in seqs} == {"SUCCESS"}  # none lost to a recycle
        pids = {c.result(s) for s in seqs}
        assert len(pids) > 2  # children were replaced

    run(app, "prefork", 2, body)


def test_a_sync_job_never_waits_behind_async_jobs_while_a_child_is_idle(
        app: Celeriac) -> None:
    async def body(c: Consumer) -> None:
        [first] = c.send(0.4, task="nap")  # child B (the other is idle: A)
        slow = c.send(*[2.0] * 5)  # async: A's loop
        [second] = c.send(0.0, task="nap")  # queued behind A or B
        await c.wait([first, second], timeout=1.5)
        assert all(s not in c.done for s in slow)
        # Both sync jobs ran on the child that took no async job.
        assert c.result(second) == c.result(first)
        await c.wait(slow)
        assert c.result(second) not in {c.result(s) for s in slow}

    run(app, "prefork", 2, body)


def test_async_jobs_spread_over_children_up_to_their_concurrency(app: Celeriac) -> None:
    async def body(c: Consumer) -> None:
        began = time.monotonic()
        seqs = c.send(*[1.0] * 120)  # 2 children x 60
        await c.wait(seqs, timeout=10)
        assert time.monotonic() - began < 2.5  # all at once, not 120 s
        pids = [c.result(s) for s in seqs]
        assert len(set(pids)) == 2 and max(pids.count(p) for p in pids) == 60

    run(app, "prefork", 2, body)
