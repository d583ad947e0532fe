"""Rate limits in a real worker on Redis: a limited task runs at its rate, other tasks
sent at the same time are not held back, ``worker_disable_rate_limits`` lifts every
limit, and a warm stop gives held messages back."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from celeriac import Celeriac, states
from celeriac.result import AsyncResult
from celeriac.testing import WorkerProcess, wait_until
from tests.integration import ratelimit_tasks as t
from tests.integration.support import bound, redis_env, workers

pytestmark = pytest.mark.slow



@pytest.fixture
def env() -> Iterator[dict[str, str]]:
    with redis_env("rl", worker_lease_timeout=2.0) as e:
        yield e


@pytest.fixture
def app(env: dict[str, str]) -> Iterator[Celeriac]:
    with bound(t.app, env) as a:
        yield a


@pytest.fixture
def start_worker(env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    with workers("tests.integration.ratelimit_tasks", env, tmp_path, "-c", "2") as pool:
        yield lambda *args, **extra_env: pool.start(*args, extra_env=extra_env)


def times(app: Celeriac, results: list[AsyncResult[Any]], timeout: float = 20
          ) -> list[tuple[float, float]]:
    """(started, finished) of each task, in sending order."""
    done = app.backend.wait_for([r.id for r in results], timeout=timeout)
    assert all(done[r.id].state == states.SUCCESS for r in results)
    return [tuple(done[r.id].result) for r in results]  # type: ignore[misc]


def test_limited_task_runs_at_its_rate_and_others_are_not_held_back(
        app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker()
    # The limited ones first: the free ones are behind them in the same queue.
    limited = t.limited.delay_many([(i,) for i in range(20)])
    free = t.free.delay_many([(i,) for i in range(20)])
    lim, fre = times(app, limited), times(app, free)
    starts = sorted(s for s, _ in lim)
    span = max(f for _, f in lim) - starts[0]
    print(f"20 at 10/s: {span:.2f}s; 20 free done {max(f for _, f in fre) - starts[0]:.2f}s "
          "after the first limited start")
    assert 1.5 <= span <= 4.0
    # No burst: every 5 consecutive starts span about 4 intervals (0.4 s).
    assert min(b - a for a, b in zip(starts, starts[4:], strict=False)) >= 0.3
    # The free ones all finished while most limited ones still waited their turn.
    assert max(f for _, f in fre) < starts[10]


def test_disable_rate_limits_runs_the_limited_task_flat_out(
        app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker(CELERIAC_WORKER_DISABLE_RATE_LIMITS="true")
    lim = times(app, t.limited.delay_many([(i,) for i in range(20)]))
    span = max(f for _, f in lim) - min(s for s, _ in lim)
    print(f"20 with rate limits disabled: {span:.3f}s")
    assert span < 1.0


def test_warm_stop_gives_held_messages_back(
        app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    w = start_worker()
    results = t.trickle.delay_many([(i,) for i in range(8)])  # 2/s: 4 s for all
    wait_until(lambda: results[1].state == states.SUCCESS, 10)
    assert w.stop() == 0
    done = sum(1 for r in results if r.state == states.SUCCESS)
    match = re.search(r"warm shutdown: (\d+) task\(s\) running, (\d+) prefetched", w.log)
    assert match, w.log
    assert done < 8 and int(match.group(2)) == 8 - done  # held ones were given back
    assert app.transport.queue_length("celery") == 8 - done  # none lost, none ran twice
    start_worker(CELERIAC_WORKER_DISABLE_RATE_LIMITS="true")
    times(app, results)
