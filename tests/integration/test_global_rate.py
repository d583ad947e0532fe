"""Global rate limits through real workers on Redis: 4 worker processes drain a task
limited to 50/s cluster-wide; the rate measured over about 10 s is within 10% of it and
no task is lost. A task with both limits runs at the tighter one."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from celeriac import Celeriac, states
from celeriac.testing import WorkerProcess
from tests.integration import cluster_tasks as t
from tests.integration.support import bound, redis_env, workers

pytestmark = pytest.mark.slow



@pytest.fixture
def env() -> Iterator[dict[str, str]]:
    with redis_env("grl", worker_lease_timeout=2.0) as e:
        yield e


@pytest.fixture
def app(env: dict[str, str]) -> Iterator[Celeriac]:
    with bound(t.app, env) as a:
        yield a


@pytest.fixture
def start_workers(env: dict[str, str], tmp_path: Path
                  ) -> Iterator[Callable[..., list[WorkerProcess]]]:
    with workers("tests.integration.cluster_tasks", env, tmp_path,
                 "--without-gossip") as pool:

        def start(count: int, *args: str, extra_env: dict[str, str] | None = None
                  ) -> list[WorkerProcess]:
            # Started together, then waited for: the starts overlap.
            started = [pool.start("-n", f"g{i}@%h", *args, wait_ready=False,
                                  extra_env=extra_env) for i in range(count)]
            for w in started:
                w.wait_for_log(r" ready: ", 30)
            return started

        yield start


def measure(app: Celeriac, name: str, count: int, timeout: float) -> list[Any]:
    """Send ``count`` calls of ``name``; what each returned (its start time first),
    sorted."""
    results = app.send_many(name, [((i,), {}) for i in range(count)])
    done = app.backend.wait_for([r.id for r in results], timeout=timeout)
    assert len(done) == count, f"{count - len(done)} task(s) lost"
    assert all(m.state == states.SUCCESS for m in done.values())
    return sorted(m.result for m in done.values())


def rate(starts: list[float], burst: int = 1) -> float:
    """Starts per second after the first ``burst`` (the bucket starts full)."""
    return (len(starts) - burst) / (starts[-1] - starts[0])


def test_four_workers_share_one_global_limit_of_50_per_second(
        app: Celeriac, start_workers: Callable[..., list[WorkerProcess]]) -> None:
    start_workers(4, "-c", "2")
    begin = time.monotonic()
    starts = measure(app, t.metered.name, 510, timeout=40)
    span = starts[-1] - starts[0]
    windows = [sum(1 for s in starts if a <= s < a + 1.0)
               for a in (starts[0] + k for k in range(int(span)))]
    measured = rate(starts, burst=5)  # the first batch of 5 tokens: the allowed burst
    print(f"510 tasks in {span:.2f}s: {measured:.1f}/s (in {time.monotonic() - begin:.1f}s "
          f"from the send); per second {windows}")
    assert 45.0 <= measured <= 55.0
    assert max(windows) <= 50 + 5 + 1  # no second over the limit by more than a batch


def test_a_task_with_both_limits_keeps_each(
        app: Celeriac, start_workers: Callable[..., list[WorkerProcess]]) -> None:
    start_workers(2, "-c", "1", extra_env={"CELERIAC_WORKER_PREFETCH_MULTIPLIER": "1"})
    done = measure(app, t.doubly.name, 90, timeout=30)
    starts = [s for s, _ in done]
    by_worker = {h: [s for s, w in done if w == h] for _, h in done}
    rates = {h: round(rate(s), 1) for h, s in by_worker.items() if len(s) > 1}
    print(f"global 30/s, 20/s per worker: {rate(starts):.1f}/s in all; {rates}")
    assert len(by_worker) == 2
    assert 25.0 <= rate(starts) <= 31.5  # the global limit binds: 2 x 20/s is more
    assert all(r <= 21.0 for r in rates.values())  # and each worker keeps its own
