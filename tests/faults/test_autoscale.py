"""The autoscaler on a real prefork worker and a real Redis: it grows with the queue's
backlog, not only with what the worker prefetched (worker_prefetch_multiplier=1 keeps
nothing reserved, so that alone never grew the pool)."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from celeriac import Celeriac
from celeriac.testing import WorkerProcess
from tests.contracts.conftest import _drop_redis_namespace
from tests.faults.test_prefork import children_of
from tests.integration import app_tasks as t
from tests.services import require

pytestmark = pytest.mark.slow

GREW = re.compile(r"pool grew by \d+ to (\d+)")


@pytest.fixture
def env(env: dict[str, str]) -> Iterator[dict[str, str]]:
    """Broker and results in a namespace of their own on the shared Redis, deleted after."""
    url = f"{require('redis')}?namespace=as{uuid.uuid4().hex[:12]}"
    yield {**env, "CELERIAC_BROKER_URL": url, "CELERIAC_RESULT_BACKEND": url}
    _drop_redis_namespace(url)


def sizes(w: WorkerProcess) -> list[int]:
    """The pool sizes the worker logged as it grew."""
    return [int(n) for n in GREW.findall(w.log)]


def test_grows_to_max_with_prefetch_multiplier_1(
        app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    w = start_worker("--autoscale", "4,1",
                     extra_env={"CELERIAC_WORKER_PREFETCH_MULTIPLIER": "1"})
    began = time.monotonic()
    results = [t.sleep.delay(1) for _ in range(12)]
    done = app.backend.wait_for([r.id for r in results], 6)
    took = time.monotonic() - began
    assert len(done) == 12, f"{12 - len(done)} of 12 tasks unfinished after 6s:\n{w.log}"
    assert max(sizes(w), default=1) == 4, w.log
    print(f"12 x 1s tasks took {took:.1f}s; pool sizes logged: {sizes(w)}")


def test_children_added_get_work_at_once(
        app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    """With multiplier 1 the worker holds only what runs: the children a grow adds must
    get the waiting tasks as they come up, not when the running task ends."""
    w = start_worker("--autoscale", "4,1",
                     extra_env={"CELERIAC_WORKER_PREFETCH_MULTIPLIER": "1"})
    began = time.monotonic()
    results = [t.sleep.delay(4) for _ in range(4)]
    # All four at once after the first tick (<= 1 s) and the fork: about 5 s. Handed
    # over only when the first task ends, the last three finish at about 8 s.
    done = app.backend.wait_for([r.id for r in results], 6.5)
    assert len(done) == 4, f"{4 - len(done)} of 4 tasks unfinished after 6.5s:\n{w.log}"
    assert time.monotonic() - began < 6.5
    assert sizes(w) == [4], w.log


def test_stays_at_min_without_backlog(
        app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    w = start_worker("--autoscale", "4,1",
                     extra_env={"CELERIAC_WORKER_PREFETCH_MULTIPLIER": "1"})
    # One task at a time: the queue never holds more than the one child is running.
    for _ in range(4):
        assert t.sleep.delay(0.5).get(timeout=10) == 0.5
    # Then three more autoscaler ticks (1 s apart), the pool idle.
    with pytest.raises(TimeoutError):
        w.wait_for_log("pool grew", timeout=3)
    assert len(children_of(w.pid)) == 1


