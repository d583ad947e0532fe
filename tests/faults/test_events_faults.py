"""Events while the broker is down: a Redis server of the test's own is stopped and
started again (never the shared one)."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celeriac import Celeriac
from celeriac.events import EventDispatcher, EventReceiver
from celeriac.testing import wait_until
from tests.services import IN_CI, reachable

pytestmark = pytest.mark.slow


class RedisServer:
    def __init__(self, exe: str, directory: Path) -> None:
        with socket.socket() as s:  # a free port (the server binds it right after)
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.argv = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
                     str(directory), "--save", "", "--appendonly", "no"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL)
        wait_until(lambda: reachable("127.0.0.1", self.port), 10, message="redis up")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        wait_until(lambda: not reachable("127.0.0.1", self.port), 10, message="redis down")


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    exe = shutil.which("redis-server")
    if exe is None:
        if IN_CI:
            pytest.fail("redis-server is not installed")
        pytest.skip("redis-server is not installed")
    server = RedisServer(exe, tmp_path)
    server.start()
    yield server
    if server.proc is not None and server.proc.poll() is None:
        server.proc.kill()
        server.proc.wait(5)


def test_events_held_while_redis_is_down_are_delivered_after_and_overflow_counted(
        redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "celeriac.events")
    app = Celeriac("t", broker=redis_server.url, events_offline_buffer=40,
                   events_buffer_limit=10, events_flush_interval=0.02)
    d = EventDispatcher(app, hostname="w1@h")
    # Pub/sub keeps nothing: events published in the few milliseconds between the
    # server's return and the monitor's new subscription would reach no one. The gate
    # makes the dispatcher see the broker as down until then; the outage itself is real.
    gate = threading.Event()
    gate.set()
    real = d.transport.broadcast

    def broadcast(channel: str, payload: bytes, routing_key: str = "") -> None:
        if not gate.is_set():
            raise ConnectionError("test: held until the monitor has subscribed again")
        real(channel, payload, routing_key)

    real_has = d.transport.has_subscribers

    def has_subscribers(channel: str) -> bool:
        if not gate.is_set():
            raise ConnectionError("test: held until the monitor has subscribed again")
        return real_has(channel)

    d.transport.broadcast = broadcast  # type: ignore[method-assign]
    d.transport.has_subscribers = has_subscribers  # type: ignore[method-assign]
    got: list[dict[str, Any]] = []

    async def main() -> None:
        async with EventReceiver(app, {"*": got.append}) as receiver:
            d.send("worker-online", freq=2.0)
            assert await receiver.acapture(limit=1, timeout=10) == 1

        redis_server.stop()
        start = time.monotonic()
        for i in range(100):
            assert d.send("task-received", uuid=f"u{i}", name="add") is not None
        assert time.monotonic() - start < 0.5          # the caller never waits
        wait_until(lambda: "cannot reach the broker" in caplog.text, 10,
                   message="the sender noticed the outage")
        wait_until(lambda: d.dropped == 60, 10, message="the oldest 60 dropped")
        assert not d.flush(0.1)

        gate.clear()
        redis_server.start()
        async with EventReceiver(app, {"*": got.append}) as receiver:
            gate.set()
            assert await receiver.acapture(limit=40, timeout=30) == 40
        assert d.flush(10)

    try:
        asyncio.run(main())
    finally:
        d.close()
    assert [e["uuid"] for e in got[1:]] == [f"u{i}" for i in range(60, 100)]
    # Stamped as they leave, in order; the dropped ones never left and took no value.
    assert [e["clock"] for e in got] == list(range(1, 42))
    assert d.dropped == 60
    outage = [r.getMessage() for r in caplog.records if r.name.endswith("dispatcher")]
    assert len(outage) == 2, outage                  # one warning, one info
    assert "reachable again" in outage[1] and "40 held events (60 dropped)" in outage[1]


def test_receiver_subscribes_again_after_a_restart(redis_server: RedisServer,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "celeriac.events")
    app = Celeriac("t", broker=redis_server.url)
    d = EventDispatcher(app, hostname="w1@h")

    async def main() -> dict[str, Any] | None:
        async with EventReceiver(app) as receiver:
            d.send("worker-online", freq=2.0)
            assert await receiver.get(10) is not None
            redis_server.stop()
            assert await receiver.get(0.3) is None        # lost: it keeps trying
            redis_server.start()
            for _ in range(100):  # bounded: until a heartbeat reaches the new subscription
                d.send("worker-heartbeat", freq=2.0)
                event = await receiver.get(0.2)
                if event is not None:
                    return event
            return None

    try:
        event = asyncio.run(main())
    finally:
        d.close()
    assert event is not None and event["type"] == "worker-heartbeat"
    assert "subscription lost" in caplog.text and "subscribed again" in caplog.text


def test_worker_side_send_never_blocks_when_the_broker_is_unreachable() -> None:
    """Nothing listens on this port: send() returns at once, close() within its timeout."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = Celeriac("t", broker=f"redis://127.0.0.1:{port}/0", events_offline_buffer=5)
    d = EventDispatcher(app, hostname="w1@h")
    start = time.monotonic()
    for i in range(1000):
        d.send("task-received", uuid=f"u{i}")
    assert time.monotonic() - start < 0.5
    start = time.monotonic()
    d.close(timeout=0.5)
    assert time.monotonic() - start < 3
    assert d.dropped == 1000
    assert os.getpid() == d.pid
