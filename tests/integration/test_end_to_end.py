"""A real worker process on the embedded SQLite broker, driven from this process."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from celeriac import Celeriac, TaskRevoked, states
from celeriac.testing import WorkerProcess
from tests.integration import app_tasks as t

pytestmark = pytest.mark.slow


def test_delay_and_get(app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker()
    result = t.add.delay(2, 3)
    assert result.get(timeout=10) == 5
    assert result.state == states.SUCCESS
    assert result.ready() and result.successful()
    assert result.result == 5


def test_bound_task_sees_its_request(app: Celeriac, start_worker: Callable[..., WorkerProcess]
                                     ) -> None:
    w = start_worker("-n", "node1@test")
    r = t.whoami_bound.apply_async(task_id="fixed-id-1")
    assert r.get(timeout=10) == {"id": "fixed-id-1", "retries": 0, "hostname": "node1@test",
                                 "queue": "celery", "args": []}
    w.wait_for_log(r"whoami_bound\[fixed-id-1\] succeeded")  # task id in its log line


def test_retry_then_success(app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    w = start_worker()
    r = t.flaky.delay(7)
    assert r.get(timeout=15) == 7
    assert app.backend.get(r.id).retries == 2  # type: ignore[union-attr]
    w.wait_for_log(rf"flaky\[{r.id}\] succeeded")
    assert w.log.count(f"app_tasks.flaky[{r.id}] retry") == 2


def test_retry_past_max_retries_fails_with_the_exception(
        app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker()
    with pytest.raises(KeyError, match="still broken"):
        t.always_retry.delay().get(timeout=15)


def test_autoretry_for_with_backoff(app: Celeriac, tmp_path: Path,
                                    start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker()
    marker = tmp_path / "attempts"
    assert t.auto.delay(str(marker)).get(timeout=15) == 3
    assert marker.read_text() == "3"


def test_failure_reraises_builtin_type_with_remote_traceback(
        app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker()
    r = t.boom.delay("value")
    with pytest.raises(ValueError, match="bad value"):
        r.get(timeout=10)
    assert r.state == states.FAILURE
    assert r.traceback is not None and "raise ValueError" in r.traceback
    assert isinstance(r.get(timeout=1, propagate=False), ValueError)


def test_failure_of_a_user_type_reraises_it_where_it_is_imported(
        app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker()
    with pytest.raises(t.NotAllowed, match="custom failure") as info:
        t.boom.delay("custom").get(timeout=10)
    assert "NotAllowed" in "".join(getattr(info.value, "__notes__", []))


def test_allowlisted_exception_type_is_recreated(
        app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker()
    app.settings = app.settings.replace(result_exception_allowlist=(t.NotAllowed,))
    with pytest.raises(t.NotAllowed, match="custom failure"):
        t.boom.delay("custom").get(timeout=10)


def test_wrong_number_of_arguments_is_failure_with_type_error(
        app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    w = start_worker()
    r = app.send_task("tests.integration.app_tasks.add", [1, 2, 3])
    with pytest.raises(TypeError, match="positional argument"):
        r.get(timeout=10)
    assert t.add.delay(1, 1).get(timeout=10) == 2  # worker alive
    assert w.proc is not None and w.proc.poll() is None


def test_send_task_by_name(app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker()
    assert app.send_task("tests.integration.app_tasks.add", [20, 22]).get(timeout=10) == 42


def test_countdown_is_held_by_the_broker(app: Celeriac,
                                         start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker()
    sent = time.time()
    r = t.stamp.apply_async(countdown=0.6)
    ran_at = r.get(timeout=10)
    assert 0.55 <= ran_at - sent < 3.0


def test_expired_task_is_revoked(app: Celeriac, start_worker: Callable[..., WorkerProcess]
                                 ) -> None:
    r = t.add.apply_async((1, 1), expires=0.05)
    time.sleep(0.1)  # sleep-ok: let it expire before any worker exists
    start_worker()
    with pytest.raises(TaskRevoked):
        r.get(timeout=10)
    assert r.state == states.REVOKED


def test_idle_worker_picks_up_at_once(app: Celeriac,
                                     start_worker: Callable[..., WorkerProcess]) -> None:
    """An idle worker is woken by a publish, it does not poll: a missed wake-up would
    wait for its next fetch (seconds). Woken, the median is a few milliseconds on an
    idle machine (bench/ measures it); the bound leaves a loaded machine room."""
    start_worker()
    t.stamp.delay().get(timeout=10)  # warm up
    latencies = []
    for _ in range(15):
        time.sleep(0.05)  # sleep-ok: let the worker go idle in its wait
        sent = time.time()
        latencies.append(t.stamp.delay().get(timeout=10) - sent)
    median = statistics.median(latencies)
    print(f"idle pickup latency: median {median * 1000:.2f} ms, max {max(latencies) * 1000:.2f} ms")
    assert median < 0.25


def test_many_tasks_all_results(app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker()
    results = [t.add.delay(i, i) for i in range(500)]
    done = app.backend.wait_for([r.id for r in results], timeout=30)
    assert len(done) == 500
    assert all(done[r.id].result == 2 * i for i, r in enumerate(results))


def test_two_workers_share_one_sqlite_file(app: Celeriac,
                                           start_worker: Callable[..., WorkerProcess]) -> None:
    a = start_worker("-n", "a@test")
    b = start_worker("-n", "b@test")
    results = [t.whoami_bound.delay() for _ in range(200)]
    done = app.backend.wait_for([r.id for r in results], timeout=30)
    assert len(done) == 200
    ids = [m.result["id"] for m in done.values()]
    assert len(set(ids)) == 200
    assert a.proc is not None and b.proc is not None
