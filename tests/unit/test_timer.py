import asyncio

import pytest

from celeriac.worker.timer import Timer


def test_call_after_and_call_at_fire_in_order() -> None:
    async def main() -> list[str]:
        timer = Timer()
        fired: list[str] = []
        done = asyncio.Event()
        timer.call_after(0.02, fired.append, "second")
        timer.call_at(timer.time() + 0.01, fired.append, "first")
        timer.call_after(0.03, done.set)
        await asyncio.wait_for(done.wait(), 2)
        return fired

    assert asyncio.run(main()) == ["first", "second"]


def test_call_repeatedly_does_not_drift_and_survives_a_failing_callback(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> tuple[list[float], float]:
        timer = Timer()
        ticks: list[float] = []
        done = asyncio.Event()

        def tick() -> None:
            ticks.append(timer.time())
            if len(ticks) == 10:
                done.set()
            if len(ticks) % 3 == 0:
                raise RuntimeError("boom")
            # A slow callback: with naive re-scheduling its 20 ms would add up to 0.2 s of
            # drift over ten ticks.
            end = timer.time() + 0.02
            while timer.time() < end:
                pass

        start = timer.time()
        entry = timer.call_repeatedly(0.05, tick)
        await asyncio.wait_for(done.wait(), 5)
        entry.cancel()
        return ticks, start

    ticks, start = asyncio.run(main())
    assert len(ticks) == 10
    # Tick k lands on start + k*interval; its error does not accumulate. Naive
    # re-scheduling would have each of the last three ticks 0.14 s late or more; one of
    # them on time within 0.1 s shows no drift, and leaves a loaded machine's scheduling
    # delay of any single tick room.
    late = [t - (start + k * 0.05) for k, t in enumerate(ticks, 1)]
    assert min(late) > -0.01  # never early
    assert min(late[-3:]) < 0.1, late
    assert caplog.text.count("raised") == 3


def test_cancel_stops_future_ticks() -> None:
    async def main() -> int:
        timer = Timer()
        count = 0

        def tick() -> None:
            nonlocal count
            count += 1
            if count == 2:
                entry.cancel()

        entry = timer.call_repeatedly(0.005, tick)
        await asyncio.sleep(0.1)  # sleep-ok: proving nothing more happens
        return count

    assert asyncio.run(main()) == 2


def test_coroutine_callbacks_do_not_overlap() -> None:
    async def main() -> tuple[int, int]:
        timer = Timer()
        running = peak = 0
        calls = 0

        async def slow() -> None:
            nonlocal running, peak, calls
            calls += 1
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.03)  # sleep-ok: the slow callback itself
            running -= 1

        entry = timer.call_repeatedly(0.01, slow)
        await asyncio.sleep(0.15)  # sleep-ok: a fixed observation window
        entry.cancel()
        return peak, calls

    peak, calls = asyncio.run(main())
    assert peak == 1 and calls >= 2
