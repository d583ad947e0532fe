"""A running ``async def`` task seen and stopped: ``inspect active`` / ``query_task`` list it,
and ``revoke(terminate=True)`` cancels that coroutine alone (its child, and the other
tasks on the child's loop, go on); it ends ``REVOKED``, acknowledged, never redelivered.
A task that ignores the cancellation is killed with its child after
``worker_async_kill_grace`` (its siblings run again, uncounted). The threads pool's loop
cancels the same way. Real workers on Redis, real processes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celeriac import Celeriac, states
from celeriac.errors import TaskRevoked
from celeriac.testing import wait_until
from tests.faults import async_revoke_tasks as at
from tests.integration.support import Workers, bound, redis_env, workers

pytestmark = pytest.mark.slow

NODE = "arevoke@test"


@pytest.fixture
def env() -> Iterator[dict[str, str]]:
    with redis_env("arv", WORKER_LEASE_TIMEOUT=2.0) as e:
        yield e


@pytest.fixture
def app(env: dict[str, str]) -> Iterator[Celeriac]:
    with bound(at.app, env) as a:
        yield a


@pytest.fixture
def pool(env: dict[str, str], tmp_path: Path) -> Iterator[Workers]:
    with workers("tests.faults.async_revoke_tasks", env, tmp_path, "-n", NODE) as w:
        yield w


def runs(marks: Path, task_id: str) -> dict[int, int]:
    """pid -> how many times the task started there."""
    return {int(f.name.split("-")[0]): f.read_text().count("started")
            for f in marks.iterdir() if f.name.endswith(task_id)}


def started(marks: Path, n: int) -> list[Path]:
    return wait_until(lambda: len(list(marks.iterdir())) == n and list(marks.iterdir()), 20,
                      message=f"{n} tasks started")


def active(app: Celeriac) -> list[dict[str, Any]]:
    got = app.control.inspect(destination=[NODE], timeout=5).active()
    assert got is not None, "no reply to inspect active"
    infos: list[dict[str, Any]] = got[NODE]
    return infos


def query(app: Celeriac, task_id: str) -> list[Any] | None:
    got = app.control.inspect(destination=[NODE], timeout=5).query_task(task_id)
    assert got is not None, "no reply to query_task"
    found: list[Any] | None = got[NODE].get(task_id)
    return found


def revoke(app: Celeriac, task_id: str) -> Any:
    return app.control.revoke(task_id, terminate=True, signal="SIGKILL", reply=True,
                              destination=[NODE], timeout=5)


def test_prefork_revoke_terminate_cancels_one_async_task_and_its_loop_goes_on(
        app: Celeriac, pool: Workers, tmp_path: Path) -> None:
    w = pool.start("-c", "1", "--child-concurrency", "4")
    marks, gate = tmp_path / "marks", tmp_path / "gate"
    marks.mkdir()
    siblings = [at.gated.delay(str(gate), str(marks)) for _ in range(3)]
    target = at.victim.delay(str(marks))
    child = int(started(marks, 4)[0].name.split("-")[0])

    # Seen: all four on the child's loop, with the child's pid and a start time.
    shown = active(app)
    assert {a["id"] for a in shown} == {target.id, *(r.id for r in siblings)}, shown
    assert all(a["worker_pid"] == child and a["time_start"] for a in shown), shown
    found = query(app, target.id)
    assert found is not None and found[0] == "active", found
    assert found[1]["worker_pid"] == child

    # A fifth waits behind the full loop (or in the consumer); revoked there, it is
    # cancelled as it starts (the child starts it as room opens, before the parent
    # hears, so it may take its first step).
    late = at.victim.delay(str(marks))
    wait_until(lambda: query(app, late.id), 10, message="the fifth one held")
    assert revoke(app, late.id) is not None

    began = time.monotonic()
    assert revoke(app, target.id) == [{NODE: {"ok": f"terminate: {target.id}"}}]
    with pytest.raises(TaskRevoked, match="terminated: cancelled on child"):
        target.get(timeout=10)
    latency = time.monotonic() - began
    print(f"\nasync revoke with terminate: REVOKED {latency * 1000:.0f} ms after the "
          "command was sent")
    # The task would have run 60 s; the bound leaves room for a loaded machine.
    assert latency < 5.0, latency
    assert target.state == states.REVOKED
    with pytest.raises(TaskRevoked):
        late.get(timeout=10)
    assert sum(runs(marks, late.id).values()) <= 1

    # Its siblings were not touched: still running on the same loop, then succeeding.
    assert not any(r.ready() for r in siblings)
    gate.touch()
    assert [r.get(timeout=10) for r in siblings] == [child] * 3
    assert f"{target.id}] revoked: cancelling it on child {child}'s event loop" in w.log
    assert "killing child" not in w.log

    # Acknowledged, never redelivered: after a warm stop (which gives back whatever the
    # worker still owned) nothing of it is left in the broker, and it ran once.
    assert w.stop() == 0, w.log
    assert app.transport.queue_length("celery") == 0
    assert app.transport.dead_letters() == []
    assert runs(marks, target.id) == {child: 1}


def test_prefork_async_task_ignoring_its_cancellation_is_killed_after_the_grace(
        app: Celeriac, pool: Workers, tmp_path: Path) -> None:
    w = pool.start("-c", "1", "--child-concurrency", "10",
                   extra_env={"CELERIAC_WORKER_ASYNC_KILL_GRACE": "0.5"})
    marks, gate = tmp_path / "marks", tmp_path / "gate"
    marks.mkdir()
    siblings = [at.gated.delay(str(gate), str(marks)) for _ in range(2)]
    target = at.stubborn.delay(str(marks), 60)
    child = int(started(marks, 3)[0].name.split("-")[0])

    assert revoke(app, target.id) == [{NODE: {"ok": f"terminate: {target.id}"}}]
    with pytest.raises(TaskRevoked, match=r"ignored its cancellation for 0\.5s"):
        target.get(timeout=15)
    w.wait_for_log(rf"{target.id}\] still running 0\.5s after it was cancelled .* killing "
                   rf"child {child} \(its other 2 task\(s\) will run again\)")
    # The siblings went back uncounted and run again on the new child.
    gate.touch()
    (new,) = {r.get(timeout=20) for r in siblings}
    assert new != child
    assert all(runs(marks, r.id) == {child: 1, new: 1} for r in siblings)
    assert w.proc is not None and w.proc.poll() is None, w.log
    assert "pool children died" not in w.log
    assert w.stop() == 0, w.log
    assert app.transport.queue_length("celery") == 0
    assert app.transport.dead_letters() == []
    assert runs(marks, target.id) == {child: 1}


def test_threads_pool_revoke_terminate_cancels_an_async_task_on_its_loop(
        app: Celeriac, pool: Workers, tmp_path: Path) -> None:
    w = pool.start("-P", "threads", "-c", "2",
                   extra_env={"CELERIAC_WORKER_ASYNC_KILL_GRACE": "0.3"})
    marks, gate = tmp_path / "marks", tmp_path / "gate"
    marks.mkdir()
    siblings = [at.gated.delay(str(gate), str(marks)) for _ in range(2)]
    target = at.victim.delay(str(marks))
    started(marks, 3)
    shown = active(app)
    assert {a["id"] for a in shown} == {target.id, *(r.id for r in siblings)}, shown
    assert query(app, target.id) is not None

    began = time.monotonic()
    assert revoke(app, target.id) == [{NODE: {"ok": f"terminate: {target.id}"}}]
    with pytest.raises(TaskRevoked, match="terminated: cancelled on the threads pool"):
        target.get(timeout=10)
    latency = time.monotonic() - began
    print(f"\nthreads pool async revoke with terminate: REVOKED {latency * 1000:.0f} ms")
    assert latency < 5.0, latency
    assert not any(r.ready() for r in siblings)

    # One that swallows the cancellation cannot be killed in a thread: logged after the
    # grace, REVOKED when it returns.
    slow = at.stubborn.delay(str(marks), 3.0)
    started(marks, 4)
    assert revoke(app, slow.id) == [{NODE: {"ok": f"terminate: {slow.id}"}}]
    w.wait_for_log(rf"{slow.id}\] still running 0\.3s after it was cancelled .* a thread "
                   "cannot be killed")
    with pytest.raises(TaskRevoked, match="terminated"):
        slow.get(timeout=15)

    gate.touch()
    assert {r.get(timeout=10) for r in siblings} == {w.pid}
    assert w.stop() == 0, w.log
    assert app.transport.queue_length("celery") == 0
    assert app.transport.dead_letters() == []
