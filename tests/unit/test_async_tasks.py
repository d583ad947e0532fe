"""``async def`` tasks outside a pool: direct calls, eager mode (retries, bind, autoretry),
the time-limit guard, the loop lag watch; and the solo pool (a worker in a thread)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator

import pytest

from celeriac import Celeriac, SoftTimeLimitExceeded, TimeLimitExceeded
from celeriac.runtime.aio import Guard, LagWatch
from celeriac.testing import ThreadedWorker, eager


@pytest.fixture
def app() -> Iterator[Celeriac]:
    url = f"memory://{uuid.uuid4().hex}"
    app = Celeriac("aio", broker=url, backend=url)
    yield app
    app.close()


def test_calling_an_async_task_returns_its_coroutine_with_its_request(app: Celeriac) -> None:
    @app.task(bind=True)
    async def who(self, x: int) -> tuple[int, bool]:  # type: ignore[no-untyped-def]
        await asyncio.sleep(0)  # sleep-ok: yield to the loop
        return x, self.request.called_directly

    coro = who(4)
    assert asyncio.iscoroutine(coro)
    assert asyncio.run(coro) == (4, True)
    assert who.is_async


def test_apply_runs_the_coroutine_with_retries_and_autoretry(app: Celeriac) -> None:
    attempts: list[int] = []

    @app.task(bind=True, max_retries=3)
    async def flaky(self, n: int) -> int:  # type: ignore[no-untyped-def]
        attempts.append(self.request.retries)
        if self.request.retries < 2:
            raise self.retry(countdown=0)
        return n

    @app.task(autoretry_for=(ConnectionError,), max_retries=1, default_retry_delay=0)
    async def broken() -> None:
        raise ConnectionError("down")

    assert flaky.apply((5,)).get() == 5 and attempts == [0, 1, 2]
    r = broken.apply()
    assert r.state == "FAILURE" and isinstance(r.result, ConnectionError)
    with eager(app):
        assert flaky.delay(6).get() == 6


def test_apply_from_inside_a_running_loop(app: Celeriac) -> None:
    @app.task
    async def double(x: int) -> int:
        await asyncio.sleep(0)  # sleep-ok: yield to the loop
        return 2 * x

    async def caller() -> int:
        return double.apply((21,)).get()  # type: ignore[no-any-return]

    assert asyncio.run(caller()) == 42


def test_guard_raises_the_limit_at_the_await_and_the_task_goes_on() -> None:
    async def task() -> str:
        try:
            await asyncio.sleep(10)  # sleep-ok: the coroutine under test waits
        except SoftTimeLimitExceeded:
            await asyncio.sleep(0.01)  # sleep-ok: still usable: the task was not left cancelled
            return "cleaned up"
        return "not interrupted"

    async def main() -> tuple[str, bool]:
        guard = Guard()
        t = asyncio.get_running_loop().create_task(_await(guard.wrap(task())))
        asyncio.get_running_loop().call_later(0.05, guard.interrupt, SoftTimeLimitExceeded())
        return await t, t.cancelling() == 0

    assert asyncio.run(main()) == ("cleaned up", True)


def test_guard_before_the_task_starts_and_real_cancellation() -> None:
    async def main() -> None:
        guard = Guard()
        guard.interrupt(TimeLimitExceeded("hard"))  # before the coroutine first ran
        with pytest.raises(TimeLimitExceeded):
            await _await(guard.wrap(asyncio.sleep(1)))  # sleep-ok: the coroutine under test waits
        waiting = Guard().wrap(asyncio.sleep(5))  # sleep-ok: the coroutine under test waits
        other = asyncio.get_running_loop().create_task(_await(waiting))
        await asyncio.sleep(0)  # sleep-ok: yield to the loop
        other.cancel()  # a real cancellation passes through
        with pytest.raises(asyncio.CancelledError):
            await other

    asyncio.run(main())


async def _await(awaitable: object) -> object:
    return await awaitable  # type: ignore[misc]


def test_lag_watch_names_the_blocking_task_once_per_episode(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> LagWatch:
        loop = asyncio.get_running_loop()
        watch = LagWatch(loop, 0.05, lambda t: f"task {t.get_name() if t else None}")
        watch.start()

        async def blocker() -> None:
            time.sleep(0.3)  # sleep-ok: the blocking code under test

        await asyncio.create_task(blocker(), name="the-blocker")
        await asyncio.sleep(0.05)  # sleep-ok: the loop turns again: the episode ends
        watch.close()
        return watch

    with caplog.at_level(logging.WARNING, "celeriac.aio"):
        watch = asyncio.run(main())
    assert watch.episodes == 1
    blocked = [r.getMessage() for r in caplog.records if "blocked for" in r.getMessage()]
    assert len(blocked) == 1 and "task the-blocker" in blocked[0]
    assert any("unblocked after" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_solo_pool_runs_async_tasks_on_its_loop(app: Celeriac) -> None:
    @app.task
    async def double(x: int) -> int:
        await asyncio.sleep(0.01)  # sleep-ok: the coroutine under test waits
        return 2 * x

    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    with ThreadedWorker(app, pool="solo"):
        assert double.delay(4).get(timeout=5) == 8
        assert add.delay(1, 2).get(timeout=5) == 3
        assert (double.s(1) | double.s()).delay().get(timeout=5) == 4


def test_read_frames_takes_whole_frames_only() -> None:
    import os
    import threading

    from celeriac.worker.pool import pipes

    r, w = os.pipe()
    try:
        first, second = pipes.frame(pipes.STOP, b"a" * 10), pipes.frame(pipes.JOB, b"b" * 100)
        os.write(w, first + second[:3])  # the second frame cut inside its header

        def rest() -> None:
            time.sleep(0.05)  # sleep-ok: the parent's second write comes later
            os.write(w, second[3:])

        t = threading.Thread(target=rest)
        t.start()
        frames = pipes.read_frames(r)
        t.join()
        assert frames == [(pipes.STOP, b"a" * 10), (pipes.JOB, b"b" * 100)]
        os.close(w)
        w = -1
        assert pipes.read_frames(r) is None  # EOF
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def test_a_lag_watch_restarted_after_close_does_not_spin() -> None:
    """``close`` sets its thread's wake-up event for good; a watch started again must
    not wait on that one (a spinning thread stole the GIL from everything else)."""
    import time

    from celeriac.runtime.aio import LagWatch

    loop = asyncio.new_event_loop()
    watch = LagWatch(loop, 0.1, lambda task: None)

    async def cycle() -> None:
        watch.start()
        await asyncio.sleep(0.05)  # sleep-ok: the coroutine under test waits
        watch.close()
        watch.start()
        await asyncio.sleep(0.05)  # sleep-ok: the coroutine under test waits

    try:
        loop.run_until_complete(cycle())
        used = time.process_time()
        time.sleep(0.5)  # sleep-ok: measuring what an idle watch costs
        assert time.process_time() - used < 0.1
    finally:
        watch.close()
        loop.close()
