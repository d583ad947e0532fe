"""Group commit when the broker dies under it: 16 threads call ``delay()`` on a Redis of
the test's own (AOF, fsync always: whatever it confirmed survives) that is killed with
``kill -9`` mid-stream. Every caller whose round trip was lost raises; none returns
success for a message the restarted Redis does not have."""

from __future__ import annotations

import shutil
import signal
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celeriac import Celeriac, OperationalError
from celeriac.producer import batching
from celeriac.testing import wait_until
from celeriac.transports.redis import RedisTransport
from tests.faults.redis_sets import free_ports
from tests.integration.test_group_commit import stored_ids
from tests.loops import track
from tests.services import IN_CI, reachable

THREADS = 16
LIMIT = 3000
"""Calls per thread at most (each thread stops at its first error)."""


class OwnRedis:
    def __init__(self, tmp: Path) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            if IN_CI:
                pytest.fail("redis-server is not installed")
            pytest.skip("redis-server is not installed")
        self.port = free_ports(1)[0]
        self.argv = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(tmp),
                     "--appendonly", "yes", "--appendfsync", "always", "--save", ""]
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        self.procs.append(subprocess.Popen(self.argv, stdout=subprocess.DEVNULL))
        wait_until(self.ready, 30, message="redis up, its AOF loaded")

    def ready(self) -> bool:
        if not reachable("127.0.0.1", self.port):
            return False
        client = redis.Redis(port=self.port, socket_timeout=2)
        try:
            return bool(client.ping())
        except redis.BusyLoadingError:
            return False
        finally:
            client.close()

    def kill(self) -> None:
        self.procs[-1].send_signal(signal.SIGKILL)
        self.procs[-1].wait(10)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path)
    server.start()
    yield server
    server.close()


@pytest.mark.slow  # a Redis server of its own, killed
def test_kill_9_mid_stream_no_caller_is_told_stored_what_was_lost(own_redis: OwnRedis
                                                                   ) -> None:
    url = f"redis://127.0.0.1:{own_redis.port}/0?namespace=gcf-{uuid.uuid4().hex[:6]}"
    app = Celeriac("gcf", broker=url, backend="memory://gcf",
                   broker_connection_max_retries=1, broker_connection_timeout=2.0)

    @app.task(name="gcf.add")
    def add(x: int) -> int:
        return x

    attempted: set[str] = set()
    confirmed: list[list[str]] = [[] for _ in range(THREADS)]
    errors: list[BaseException | None] = [None] * THREADS
    start = threading.Barrier(THREADS + 1)

    def produce(i: int) -> None:
        start.wait()
        for j in range(LIMIT):
            task_id = f"{i}-{j}-{uuid.uuid4().hex[:6]}"
            attempted.add(task_id)
            try:
                add.apply_async((j,), task_id=task_id)
            except Exception as exc:
                errors[i] = exc
                return
            confirmed[i].append(task_id)

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    start.wait()
    wait_until(lambda: sum(map(len, confirmed)) >= 2000, 60, message="2000 confirmed")
    own_redis.kill()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a caller never returned"
    group = batching.for_publisher(app.publisher)
    assert group is not None
    app.close()

    own_redis.start()  # from its AOF: everything it confirmed
    transport = track(RedisTransport(url, app.settings))
    try:
        stored = stored_ids(transport, "celery", len(attempted))
    finally:
        transport.close()
    told_stored = {x for chunk in confirmed for x in chunk}
    assert len(stored) == len(set(stored)), "a message stored twice"
    assert told_stored <= set(stored), f"{len(told_stored - set(stored))} confirmed, lost"
    assert set(stored) <= attempted
    # Each thread was mid-stream when Redis died: its call then raised, none hung.
    assert all(isinstance(e, OperationalError) for e in errors), errors
    assert group.round_trips < group.messages  # the calls did share round trips
