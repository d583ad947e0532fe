"""Events over every transport: what an EventDispatcher sends, an EventReceiver gets, in
each sender's order, with the receiver's clock moved past every event's.

In-process on every transport; across processes (``slow``) on every transport that can
be shared between processes.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celeriac import Celeriac
from celeriac.events import EVENTS_CHANNEL, EventDispatcher, EventReceiver
from tests.contracts.conftest import TransportFactory, _namespace

ROOT = Path(__file__).parent.parent.parent


@pytest.fixture
def events_transport(transport: TransportFactory) -> Iterator[TransportFactory]:
    """The contract's transport; on AMQP, the events exchange is deleted afterwards."""
    yield transport
    if transport.name == "amqp":
        import pika

        url = transport.url.partition("?")[0].rstrip("/") + "/%2F"
        conn = pika.BlockingConnection(pika.URLParameters(url))
        try:
            conn.channel().exchange_delete(_namespace(transport.url) + EVENTS_CHANNEL)
        finally:
            conn.close()


def _send(d: EventDispatcher, tasks: int) -> list[dict[str, Any]]:
    sent = [d.send("worker-online", freq=2.0, active=0, processed=0)]
    for i in range(tasks):
        sent.append(d.send("task-received", uuid=f"{d.hostname}-{i}", name="add",
                           args="(1, 2)", kwargs="{}"))
        sent.append(d.send("task-succeeded", uuid=f"{d.hostname}-{i}", result="3",
                           runtime=0.001))
        if i % 50 == 0:
            sent.append(d.send("worker-heartbeat", freq=2.0, active=1, processed=i))
    sent.append(d.send("worker-offline"))
    return [e for e in sent if e is not None]


def _key(e: dict[str, Any]) -> tuple[str, str, int]:
    return e["hostname"], e["type"], e["clock"]


def test_receiver_gets_what_a_dispatcher_sends_in_order(
        events_transport: TransportFactory) -> None:
    app = Celeriac("t", broker=events_transport.url)
    got: list[dict[str, Any]] = []

    async def main() -> tuple[list[dict[str, Any]], int]:
        async with EventReceiver(app, {"*": got.append}) as receiver:
            d = EventDispatcher(app, hostname="w1@h")
            try:
                sent = _send(d, 200)
                assert d.flush(20)
                handled = await receiver.acapture(limit=len(sent), timeout=30)
            finally:
                d.close()
            return sent, receiver.clock.value if handled else -1

    sent, receiver_clock = asyncio.run(main())
    assert [_key(e) for e in got] == [_key(e) for e in sent]
    assert [e["clock"] for e in got] == list(range(1, len(sent) + 1))
    assert receiver_clock > len(sent)
    assert all(isinstance(e["local_received"], float) for e in got)
    assert got[1]["args"] == "(1, 2)" and got[2]["runtime"] == 0.001


def test_two_senders_each_in_its_own_order(events_transport: TransportFactory) -> None:
    app = Celeriac("t", broker=events_transport.url)
    got: list[dict[str, Any]] = []

    async def main() -> list[dict[str, Any]]:
        async with EventReceiver(app, {"*": got.append}) as receiver:
            a = EventDispatcher(app, hostname="a@h")
            b = EventDispatcher(app, hostname="b@h")
            try:
                sent = _send(a, 60) + _send(b, 60)
                assert a.flush(20) and b.flush(20)
                await receiver.acapture(limit=len(sent), timeout=30)
            finally:
                a.close()
                b.close()
            assert receiver.clock.value > max(e["clock"] for e in sent)
            return sent

    sent = asyncio.run(main())
    for host in ("a@h", "b@h"):
        assert [_key(e) for e in got if e["hostname"] == host] == \
            [_key(e) for e in sent if e["hostname"] == host]


SENDER = """
import sys
from celeriac import Celeriac
from celeriac.events import EventDispatcher
app = Celeriac("t", broker=sys.argv[1])
d = EventDispatcher(app, hostname="remote@h")
sys.stdin.readline()  # the receiver is subscribed
for i in range(int(sys.argv[2])):
    d.send("task-received", uuid=f"u{i}", name="add")
    d.send("task-succeeded", uuid=f"u{i}", runtime=0.001)
d.send("worker-offline")
ok = d.flush(20)
d.close()
sys.exit(0 if ok else 3)
"""


@pytest.mark.slow
def test_across_processes(events_transport: TransportFactory) -> None:
    if events_transport.process_local:
        pytest.skip(f"{events_transport.name}:// lives in one process")
    app = Celeriac("t", broker=events_transport.url)
    got: list[dict[str, Any]] = []
    tasks = 150

    async def main() -> int:
        async with EventReceiver(app, {"*": got.append}) as receiver:
            proc = subprocess.Popen(
                [sys.executable, "-c", SENDER, events_transport.url, str(tasks)],
                stdin=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
            try:
                assert proc.stdin is not None
                proc.stdin.write(b"go\n")
                proc.stdin.close()
                await receiver.acapture(limit=2 * tasks + 1, timeout=60)
                return await asyncio.to_thread(proc.wait, 30)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()

    assert asyncio.run(main()) == 0
    assert len(got) == 2 * tasks + 1
    assert [e["clock"] for e in got] == list(range(1, 2 * tasks + 2))
    assert got[-1]["type"] == "worker-offline"
    assert {e["pid"] for e in got} != {os.getpid()}
