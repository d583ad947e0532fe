"""Redis Sentinel: a real set (a master, a replica, three sentinels on loopback ports), its
master killed with ``kill -9`` while a producer sends and a worker drains.

What a failover can lose is what Redis's asynchronous replication had not yet carried to
the replica when the master died: publishes the master had acknowledged in the last
moments (the replication lag; on loopback, milliseconds). The test counts the tasks whose
publish returned and that never ran, and holds that count to the publishes acknowledged
in the last ``LAG_WINDOW`` before the kill. With ``replicas_ack=1`` (``WAIT 1`` after each
publish) a publish returns only once the replica has it: nothing is lost.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from celeriac import Celeriac, OperationalError, Settings
from celeriac.testing import WorkerProcess, wait_until
from tests.faults.redis_sets import HOST, SentinelSet, sentinel_set
from tests.integration import app_tasks as t

pytestmark = pytest.mark.slow

LAG_WINDOW = 0.5
"""Seconds before the kill whose acknowledged publishes replication may not have carried
(generous: the lag on loopback is milliseconds, but this machine is shared and slow)."""
MAX_TASKS = 4000


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[SentinelSet]:
    with sentinel_set(tmp_path) as s:
        yield s


class Producer(threading.Thread):
    """Sends ``add(i, i)`` one at a time until stopped; records when each publish
    returned (acknowledged by the master)."""

    def __init__(self, app: Celeriac) -> None:
        super().__init__(daemon=True)
        self.app = app
        self.sent: list[tuple[str, float]] = []
        self.failed = 0
        self.stop = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + 40
        while not self.stop.is_set() and len(self.sent) < MAX_TASKS \
                and time.monotonic() < deadline:
            try:
                r = t.add.delay(1, 1)
            except OperationalError:
                self.failed += 1  # never acknowledged: not a loss
                continue
            self.sent.append((r.id, time.monotonic()))
            time.sleep(0.002)  # sleep-ok: the producer's pace


def failover(app: Celeriac, env: dict[str, str], sentinels: SentinelSet,
             start_worker: Callable[..., WorkerProcess], **query: str) -> tuple[int, int, int]:
    """Send, kill the master, keep sending on the promoted replica, drain. Returns (lost,
    acknowledged in the lag window, sent)."""
    ns = f"s{uuid.uuid4().hex[:8]}"
    env.update(CELERIAC_BROKER_URL=sentinels.url(ns, **query),
               CELERIAC_RESULT_BACKEND=sentinels.url(ns + "r"),
               CELERIAC_BROKER_CONNECTION_MAX_RETRIES="30")
    app.close()
    app.settings = Settings.from_env(env)
    worker = start_worker("-c", "2")
    producer = Producer(app)
    producer.start()
    try:
        wait_until(lambda: len(producer.sent) >= 300, 20, message="300 sent before the kill")
        old = sentinels.master
        sentinels.procs.kill(old)
        killed_at = time.monotonic()
        new = wait_until(lambda: (p := sentinels.current_master()) != old and p, 20,
                         interval=0.1, message="the sentinels promote the replica")
        assert new == sentinels.replica
        if "replicas_ack" in query:
            # A replica for the new master, so that WAIT 1 can be satisfied again (in
            # production: run two replicas, so one is left after a failover).
            sentinels.procs.start(old, "--replicaof", HOST, str(new))
        count = len(producer.sent)
        wait_until(lambda: len(producer.sent) >= count + 300, 30,
                   message="300 more sent on the promoted replica")
    finally:
        producer.stop.set()
        producer.join(10)
    ids = [task_id for task_id, _ in producer.sent]
    window = sum(killed_at - LAG_WINDOW <= at <= killed_at for _, at in producer.sent)
    # Drain: until every acknowledged task has a result, or none came for 10 s (a worker
    # reconnecting through the sentinels backs off: a short stall is not a loss).
    done: set[str] = set()
    stalled_since = time.monotonic()
    deadline = time.monotonic() + 40
    while len(done) < len(ids) and time.monotonic() < deadline:
        got = app.backend.wait_for([i for i in ids if i not in done], timeout=0.5)
        if got:
            done.update(got)
            stalled_since = time.monotonic()
        elif time.monotonic() - stalled_since > 10:
            break
    assert worker.proc is not None and worker.proc.poll() is None, worker.log[-3000:]
    lost = len(ids) - len(done)
    print(f"failover {query or 'async'}: sent {len(ids)}, lost {lost}, acknowledged in the "
          f"last {LAG_WINDOW}s before the kill {window}, failed publishes {producer.failed}")
    return lost, window, len(ids)


def test_failover_loses_at_most_what_was_not_yet_replicated(
        app: Celeriac, env: dict[str, str], sentinels: SentinelSet,
        start_worker: Callable[..., WorkerProcess]) -> None:
    lost, window, sent = failover(app, env, sentinels, start_worker)
    assert sent >= 600
    assert lost <= window, f"{lost} lost, more than the {window} acknowledged in the lag window"


def test_failover_with_replicas_ack_loses_nothing(
        app: Celeriac, env: dict[str, str], sentinels: SentinelSet,
        start_worker: Callable[..., WorkerProcess]) -> None:
    lost, _, sent = failover(app, env, sentinels, start_worker, replicas_ack="1",
                             replicas_ack_timeout="500")
    assert sent >= 600
    assert lost == 0
