"""Real signals against real worker processes; nothing is lost."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from celeriac import Celeriac, WorkerLostError
from celeriac.protocol import Delivery
from celeriac.testing import WorkerProcess, wait_until
from tests.integration import app_tasks as t

pytestmark = pytest.mark.slow

QUEUE = "celery"


def _owned(app: Celeriac) -> int:
    conn = app.transport.db.conn()  # type: ignore[attr-defined]
    return int(conn.execute("SELECT count(*) FROM messages WHERE owner IS NOT NULL").fetchone()[0])


POOLS = [("-P", "solo"), ("-P", "prefork", "-c", "1")]
POOL_IDS = ["solo", "prefork"]


@pytest.mark.parametrize("pool", POOLS, ids=POOL_IDS)
@pytest.mark.parametrize("how", ["sigterm", "ctrl-c-to-group"])
def test_warm_shutdown_finishes_running_task_and_gives_back_prefetched(
        app: Celeriac, tmp_path: Path, start_worker: Callable[..., WorkerProcess],
        how: str, pool: tuple[str, ...]) -> None:
    marker = tmp_path / "started"
    running = t.sleep.delay(1.0, str(marker))
    # Queued before the worker starts, so its first fetch takes all four (prefetch 4); a
    # worker that is already holding messages refetches only at its low-water mark.
    queued = [t.add.delay(i, 1) for i in range(3)]
    w = start_worker(*pool)
    wait_until(marker.exists, 10, message="task started")
    wait_until(lambda: _owned(app) == 4, 5, message="worker prefetched the rest")
    if how == "sigterm":
        w.signal(signal.SIGTERM)
    else:
        w.signal(signal.SIGINT, group=True)
    assert w.wait(15) == 0
    assert running.get(timeout=1) == 1.0  # the running task finished
    assert "warm shutdown: 1 task(s) running, 3 prefetched message(s) given back" in w.log
    assert app.transport.queue_length(QUEUE) == 3
    assert not any(r.ready() for r in queued)
    start_worker()  # nothing was lost: the next worker runs them, first delivery
    assert [r.get(timeout=10) for r in queued] == [1, 2, 3]


@pytest.mark.parametrize("pool", POOLS, ids=POOL_IDS)
@pytest.mark.parametrize("how", ["second-ctrl-c", "sigquit"])
def test_cold_shutdown_gives_back_everything_within_2s(
        app: Celeriac, tmp_path: Path, start_worker: Callable[..., WorkerProcess],
        how: str, pool: tuple[str, ...]) -> None:
    w = start_worker(*pool)
    marker = tmp_path / "started"
    running = t.sleep.delay(30, str(marker))
    wait_until(marker.exists, 10, message="task started")
    began = time.monotonic()
    if how == "sigquit":
        w.signal(signal.SIGQUIT)
    else:
        w.signal(signal.SIGINT, group=True)
        w.wait_for_log("warm shutdown")
        w.signal(signal.SIGINT, group=True)
    w.wait(5)
    assert time.monotonic() - began < 2.0
    assert not running.ready()
    assert app.transport.queue_length(QUEUE) == 1  # given back for another worker
    # The children were killed before the give-back, and that kill is not the task's
    # loss: nothing is counted against it, nothing logged as lost.
    assert "lost" not in w.log, w.log
    [d] = asyncio.run(_fetch_one(app))
    assert d.delivery_count == 1


async def _fetch_one(app: Celeriac) -> list[Delivery]:
    t2 = app.transport
    await t2.connect("inspector")
    try:
        return await t2.fetch([QUEUE], 1, 1.0)
    finally:
        await t2.disconnect()


def test_killed_worker_messages_return_when_its_lease_expires(
        app: Celeriac, tmp_path: Path, start_worker: Callable[..., WorkerProcess]) -> None:
    first = start_worker()
    marker = tmp_path / "started"
    r = t.sleep.delay(0.2, str(marker))
    wait_until(marker.exists, 10, message="task started")
    first.kill()  # SIGKILL: no goodbye, the message stays owned by the dead worker
    assert _owned(app) == 1
    start_worker()  # its heartbeat sees the expired lease (1 s) and takes the message back
    assert r.get(timeout=15) == 0.2
    assert app.backend.get(r.id) is not None


def test_live_worker_keeps_long_task_past_the_lease(
        app: Celeriac, tmp_path: Path, start_worker: Callable[..., WorkerProcess]) -> None:
    a = start_worker("-n", "a@test")
    marker = tmp_path / "started"
    r = t.sleep.delay(2.5, str(marker))  # 2.5x the 1 s lease
    wait_until(marker.exists, 10, message="task started")
    b = start_worker("-n", "b@test")
    assert r.get(timeout=15) == 2.5
    assert "dead consumers" not in a.log + b.log  # never handed out twice
    a.wait_for_log(rf"\[{r.id}\] succeeded")
    assert r.id not in b.log


def test_poison_task_is_dead_lettered_after_max_deliveries(
        app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    r = t.die.delay(3)  # os._exit(3) inside the task: the whole solo worker dies
    for attempt in range(3):
        w = start_worker("-P", "solo", wait_ready=False)
        assert w.wait(15) == 3, f"attempt {attempt}: {w.log}"
    start_worker("-P", "solo")
    with pytest.raises(WorkerLostError, match="delivered 4 times"):
        r.get(timeout=15)
    dead = wait_until(app.transport.dead_letters, 5, message="dead letter")
    assert dead[0].message.headers["id"] == r.id
    assert "task_max_deliveries=3" in dead[0].reason


def test_at_most_once_task_is_not_redelivered(
        app: Celeriac, tmp_path: Path, start_worker: Callable[..., WorkerProcess]) -> None:
    first = start_worker()
    marker = tmp_path / "started"
    r = t.at_most_once.delay(str(marker))
    wait_until(marker.exists, 10, message="task started")
    wait_until(lambda: _owned(app) == 0, 5, message="acked before running")
    first.kill()
    marker.unlink()
    start_worker()
    second_task = t.add.delay(1, 1)
    assert second_task.get(timeout=10) == 2
    assert not marker.exists() and not r.ready()
