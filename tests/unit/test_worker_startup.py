"""What a worker does before its first task, and what it leaves for after (issue 30):
the first revoked-id load runs on the loop (no thread), Gossip starts once the consumer's
first turn is back, and the events sender (a thread and a connection) once every step
has started."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import threading
import uuid
from typing import Any

import orjson
import pytest

from celeriac import Celeriac
from celeriac.events import EventDispatcher, receiver
from celeriac.stores.memory import MemoryStore
from celeriac.testing import ThreadedWorker
from celeriac.worker.steps import ConsumerStep


def _app(**settings: Any) -> Celeriac:
    url = f"memory://{uuid.uuid4().hex}"
    settings.setdefault("result_backend", url)
    app = Celeriac("startup", broker=url, set_as_current=False, **settings)

    @app.task(name="startup.add")
    def add(x: int, y: int) -> int:
        return x + y

    return app


def test_the_first_revoked_load_runs_on_the_workers_loop(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    threads: list[str] = []
    load = MemoryStore.load_if_changed

    def spy(self: MemoryStore, version: object) -> Any:
        threads.append(threading.current_thread().name)
        return load(self, version)

    monkeypatch.setattr(MemoryStore, "load_if_changed", spy)
    app = _app()
    app.control.record_revoked(["gone"])
    with ThreadedWorker(app, hostname="w@h") as w:
        # Loaded before any message was taken, in the loop's thread, not a helper's.
        assert "gone" in w.worker.revoked
        assert threads[0] == "celeriac-worker"
    app.close()


def test_gossip_starts_after_the_consumers_first_turn(monkeypatch: pytest.MonkeyPatch
                                                     ) -> None:
    seen: list[str] = []
    first_turn = ConsumerStep.first_turn

    async def turned(self: ConsumerStep, timeout: float = 0.5) -> None:
        # Without the 0.5 s bound, which a loaded machine may overrun: the order is what
        # is tested. The message is in hand, or already run (a fast child).
        await first_turn(self, 30)
        taken = len(self.consumer.deliveries) + sum(self.consumer.totals.values())
        seen.append(f"turned, {taken} taken")

    made = receiver.EventReceiver.__init__

    def receiving(self: Any, *args: Any, **kwargs: Any) -> None:
        seen.append("gossip")
        made(self, *args, **kwargs)

    monkeypatch.setattr(ConsumerStep, "first_turn", turned)
    monkeypatch.setattr(receiver.EventReceiver, "__init__", receiving)
    app = _app()
    result = app.tasks["startup.add"].delay(1, 2)
    with ThreadedWorker(app, hostname="w@h"):
        assert result.get(timeout=10) == 3
    assert seen[:2] == ["turned, 1 taken", "gossip"]
    app.close()


def test_first_turn_waits_for_the_turn_in_flight_and_no_longer_than_told() -> None:
    class Consumer:
        def __init__(self) -> None:
            self.quiet = asyncio.Event()

    async def run() -> None:
        step = ConsumerStep.__new__(ConsumerStep)
        step.consumer = Consumer()  # type: ignore[assignment]
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, step.consumer.quiet.set)
        await step.first_turn(timeout=5)
        assert step.consumer.quiet.is_set()
        step.consumer.quiet.clear()  # a turn that never ends: the timeout bounds it
        began = loop.time()
        await step.first_turn(timeout=0.05)
        assert loop.time() - began < 5

    asyncio.run(run())


class Recorder:
    """A transport that records what the sender broadcasts."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def has_subscribers(self, channel: str) -> bool:
        return True

    def broadcast(self, channel: str, payload: bytes, routing_key: str = "") -> None:
        self.sent.append(payload)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("then", ["release", "close"])
def test_a_held_dispatcher_starts_no_sender_until_released(then: str) -> None:
    transport = Recorder()
    app = Celeriac("startup", broker="memory://unused", set_as_current=False)
    d = EventDispatcher(app, hostname="w@h", transport=transport,  # type: ignore[arg-type]
                        hold=True)
    threads = threading.active_count()
    d.send("worker-online")
    d.send("worker-heartbeat")
    assert d._thread is None and threading.active_count() == threads
    assert not d.flush(0.01)  # held: nothing can leave yet
    if then == "release":
        d.release()
        assert d.flush(5)
        d.close()
    else:
        d.close(timeout=5)  # what was held goes before the sender stops
    # In the order they were sent, one clock tick each.
    events = [e for payload in transport.sent for e in orjson.loads(payload)]
    assert [(e["type"], e["clock"]) for e in events] == [
        ("worker-online", 1), ("worker-heartbeat", 2)]
    app.close()


_FREEZE_PROBE = """
import gc, os, signal, uuid
from celeriac import Celeriac, Hooks
url = f"memory://{uuid.uuid4().hex}"
app = Celeriac("frozen", broker=url, result_backend=url)
class Probe(Hooks):
    def after_worker_start(self, worker):
        os.kill(os.getpid(), signal.SIGTERM)  # handled on the loop, after start-up ends
    def before_worker_stop(self, worker):
        print("frozen", gc.get_freeze_count(), flush=True)
app.add_hooks(Probe())
raise SystemExit(app.worker(pool="solo").run())
"""


@pytest.mark.slow
def test_a_worker_process_freezes_what_start_up_made() -> None:
    # A full collection then scans only what came since: over the whole heap it stalled
    # the loop for 18 ms under load. In-process (ThreadedWorker) the heap is the host's.
    before = gc.get_freeze_count()
    with ThreadedWorker(_app()):
        pass
    assert gc.get_freeze_count() == before
    done = subprocess.run([sys.executable, "-c", _FREEZE_PROBE], capture_output=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    frozen = int(done.stdout.decode().split("frozen", 1)[1].split()[0])
    assert frozen > 10_000  # the app, its modules, the worker's steps
