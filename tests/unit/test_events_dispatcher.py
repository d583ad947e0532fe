"""EventDispatcher (batching, groups, offline buffer, close, fork) and EventReceiver."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from celeriac import Celeriac
from celeriac.events import EVENTS_CHANNEL, EventDispatcher, EventReceiver
from celeriac.events import dispatcher as dispatcher_module
from celeriac.testing import wait_until


class FakeTransport:
    """Records broadcasts; ``down`` makes them fail like an unreachable broker."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[dict[str, Any]], str]] = []
        self.down = False
        self.failures = 0
        self.closed = False
        self.listening = True
        self.lock = threading.Lock()

    def has_subscribers(self, channel: str) -> bool:
        if self.down:
            self.failures += 1
            raise ConnectionRefusedError("broker down (fake)")
        return self.listening

    def broadcast(self, channel: str, payload: bytes, routing_key: str = "") -> None:
        if self.down:
            self.failures += 1
            raise ConnectionRefusedError("broker down (fake)")
        with self.lock:
            self.calls.append((channel, orjson.loads(payload), routing_key))

    def close(self) -> None:
        self.closed = True

    @property
    def events(self) -> list[dict[str, Any]]:
        with self.lock:
            return [e for _, batch, _ in self.calls for e in batch]


@pytest.fixture
def fake() -> FakeTransport:
    return FakeTransport()


@pytest.fixture
def make(fake: FakeTransport) -> Iterator[Any]:
    made: list[EventDispatcher] = []

    def make(**settings: Any) -> EventDispatcher:
        options = {k: settings.pop(k) for k in ("groups", "buffer_groups", "enabled")
                   if k in settings}
        app = Celeriac("t", broker="memory://unused", **settings)
        d = EventDispatcher(app, hostname="w1@h", transport=fake, **options)  # type: ignore[arg-type]
        made.append(d)
        return d

    yield make
    for d in made:
        d.close(timeout=0.5)


def test_send_stamps_the_common_fields(make: Any, fake: FakeTransport) -> None:
    d = make()
    before = time.time()
    first = d.send("task-received", uuid="u1", name="add")
    second = d.send("task-started", uuid="u1")
    assert first is not None and second is not None
    assert before <= first["timestamp"] <= second["timestamp"] <= time.time()
    assert d.flush(5)
    # The sender thread stamps the rest as the events leave, in the order they were sent.
    assert first["type"] == "task-received" and first["hostname"] == "w1@h"
    assert first["pid"] == os.getpid() and isinstance(first["utcoffset"], int)
    assert (first["clock"], second["clock"]) == (1, 2) and d.clock.value == 2
    assert fake.events == [first, second]
    assert fake.calls[0][0] == EVENTS_CHANNEL


def test_buffered_group_goes_in_batches_of_the_limit(make: Any, fake: FakeTransport) -> None:
    d = make(events_buffer_limit=10, events_flush_interval=60.0)
    for i in range(25):
        d.send("task-received", uuid=f"u{i}")
    wait_until(lambda: len(fake.calls) == 2, 5, message="two full batches")
    assert [len(batch) for _, batch, _ in fake.calls] == [10, 10]
    assert fake.calls[0][2] == "task.multi"          # Celery's key for a batch
    assert d.flush(5)                             # the 5 left wait for the interval: flush
    assert [len(batch) for _, batch, _ in fake.calls] == [10, 10, 5]
    assert [e["uuid"] for e in fake.events] == [f"u{i}" for i in range(25)]
    assert d.sent == 25


def test_buffered_group_goes_after_the_flush_interval(make: Any, fake: FakeTransport) -> None:
    d = make(events_buffer_limit=1000, events_flush_interval=0.05)
    start = time.monotonic()
    for i in range(3):
        d.send("task-succeeded", uuid=f"u{i}", runtime=0.1)
    wait_until(lambda: fake.calls, 5, message="a batch after the interval")
    assert time.monotonic() - start >= 0.04
    assert [len(batch) for _, batch, _ in fake.calls] == [3]
    assert fake.calls[0][2] == "task.multi"


def test_unbuffered_group_goes_at_once_and_keeps_order(make: Any, fake: FakeTransport) -> None:
    d = make(events_buffer_limit=1000, events_flush_interval=60.0)
    d.send("task-received", uuid="u1")
    d.send("task-started", uuid="u1")
    d.send("worker-heartbeat", freq=2.0, active=1, processed=0)
    # The heartbeat wakes the sender, which takes the task events queued before it along,
    # one payload per group so routing keys stay meaningful.
    wait_until(lambda: len(fake.calls) == 2, 5, message="sent without waiting 60 s")
    assert [(len(b), rk) for _, b, rk in fake.calls] == [(2, "task.multi"),
                                                         (1, "worker.heartbeat")]
    assert [e["clock"] for e in fake.events] == [1, 2, 3]


def test_groups_enable_and_disable(make: Any, fake: FakeTransport) -> None:
    d = make(groups=["worker"])
    assert d.send("task-received", uuid="u1") is None
    assert not d.enabled_for("task-received") and d.enabled_for("worker-online")
    assert d.send("worker-online", freq=2.0) is not None
    d.groups = None                               # all groups, from now on
    assert d.send("task-received", uuid="u2") is not None
    d.groups = ["task"]
    assert d.send("worker-heartbeat") is None
    d.enabled = False
    assert d.send("task-received", uuid="u3") is None and not d.enabled_for("task-started")
    assert d.flush(5)
    assert [e["type"] for e in fake.events] == ["worker-online", "task-received"]
    assert [e["clock"] for e in fake.events] == [1, 2]   # disabled events take no tick


def test_events_hide_args_is_the_callers_job(make: Any, fake: FakeTransport) -> None:
    """The dispatcher sends what it is given: the code building task-received /
    task-sent (worker consumer, send_task) leaves args and kwargs out when
    ``events_hide_args`` is on."""
    d = make(events_hide_args=True)
    d.send("task-received", uuid="u1", args="(1,)", kwargs="{}")
    assert d.flush(5)
    assert fake.events[0]["args"] == "(1,)"


def test_nothing_is_sent_while_nobody_listens(make: Any, fake: FakeTransport) -> None:
    d = make(events_flush_interval=0.01)
    fake.listening = False
    for i in range(5):
        d.send("task-received", uuid=f"u{i}")
    assert d.flush(5)
    assert fake.calls == [] and d.unheard == 5 and d.dropped == 0
    fake.listening = True
    d.send("task-received", uuid="u5")
    assert d.flush(5)
    assert [e["uuid"] for e in fake.events] == ["u5"] and d.unheard == 5


def test_values_json_cannot_hold_are_sent_as_repr(make: Any, fake: FakeTransport) -> None:
    d = make()
    d.send("task-received", uuid="u1", eta=object, tags={1: "x"})
    assert d.flush(5)
    assert fake.events[0]["eta"] == repr(object) and fake.events[0]["tags"] == {"1": "x"}


def test_outage_holds_events_drops_oldest_and_logs_twice(
        make: Any, fake: FakeTransport, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "celeriac.events.dispatcher")
    d = make(events_offline_buffer=20, events_buffer_limit=5, events_flush_interval=0.01)
    fake.down = True
    for i in range(50):
        assert d.send("task-received", uuid=f"u{i}") is not None   # never blocks, never raises
    wait_until(lambda: fake.failures >= 3, 10, message="the sender retried")
    assert not d.flush(0.05)                     # cannot: the broker is down
    assert d.dropped == 30
    fake.down = False
    assert d.flush(10)
    assert [e["uuid"] for e in fake.events] == [f"u{i}" for i in range(30, 50)]
    # The dispatcher's own lines (another component's, e.g. a loop-lag warning of an
    # earlier test's thread, may be captured too).
    mine = [r for r in caplog.records if r.name == "celeriac.events.dispatcher"]
    warnings = [r for r in mine if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "cannot reach the broker" in warnings[0].getMessage()
    # The sender thread logs the recovery right after the send that flush waited for.
    infos = wait_until(lambda: [r for r in caplog.records if r.levelno == logging.INFO
                                and r.name == "celeriac.events.dispatcher"], 5,
                       message="the recovery log line")
    assert len(infos) == 1 and "20 held events (30 dropped)" in infos[0].getMessage()


def test_backoff_is_capped(make: Any, fake: FakeTransport,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    delays: list[float] = []
    d = make()
    real_wait = d._stop.wait

    def wait(delay: float) -> bool:
        delays.append(delay)
        return real_wait(0.001)

    monkeypatch.setattr(d._stop, "wait", wait)
    fake.down = True
    d.send("worker-online")
    wait_until(lambda: len(delays) >= 10, 10, message="ten retries")
    assert delays[:7] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0]
    assert max(delays) == dispatcher_module.BACKOFF_MAX == 2.0
    fake.down = False
    assert d.flush(5)


def test_close_sends_what_is_queued_then_refuses(make: Any, fake: FakeTransport) -> None:
    d = make(events_flush_interval=60.0)
    d.send("task-received", uuid="u1")
    d.close()
    assert [e["uuid"] for e in fake.events] == ["u1"]
    assert d.send("task-received", uuid="u2") is None
    assert not fake.closed                       # the caller's transport: the caller closes it


def test_close_gives_up_within_its_timeout_when_the_broker_is_down(
        make: Any, fake: FakeTransport) -> None:
    d = make()
    fake.down = True
    d.send("task-received", uuid="u1")
    d.send("task-received", uuid="u2")
    start = time.monotonic()
    d.close(timeout=0.3)
    assert time.monotonic() - start < 2.0
    assert d.dropped == 2


def test_own_transport_without_connection_retry() -> None:
    app = Celeriac("t", broker=f"memory://{uuid.uuid4().hex}")
    d = EventDispatcher(app)
    try:
        assert d.transport.settings.broker_connection_retry is False
        assert app.settings.broker_connection_retry is True
        assert d.hostname.startswith("celeriac@")
    finally:
        d.close()


def test_disabled_dispatcher_starts_no_thread(make: Any) -> None:
    d = make(enabled=False)
    assert d._thread is None and d.send("task-received", uuid="u") is None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def _exit_code(pid: int, hung: str, timeout: float = 10.0) -> int:
    """The forked child's exit code; kills it and fails with ``hung`` past ``timeout``."""
    def exited() -> tuple[int] | None:
        done, status = os.waitpid(pid, os.WNOHANG)
        return (os.waitstatus_to_exitcode(status),) if done else None

    try:
        return wait_until(exited, timeout, message="the child's exit")[0]
    except TimeoutError:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail(hung)


def test_forked_child_does_not_deadlock_on_the_dispatcher(make: Any) -> None:
    d = make()
    d.send("task-received", uuid="u1")
    held = threading.Event()
    release = threading.Event()

    def hold() -> None:  # as if the sender thread held the lock at the instant of fork
        with d._lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(5)
    pid = os.fork()
    if pid == 0:  # the child: everything must return at once
        code = 1
        try:
            ok = (d.send("task-received", uuid="u2") is None and not d.enabled
                  and d.flush(0.1) and d.clock.forward() > 0)
            d.close(timeout=0.1)
            code = 0 if ok else 2
        finally:
            os._exit(code)
    release.set()
    holder.join(5)
    assert _exit_code(pid, "the forked child deadlocked on the dispatcher") == 0
    assert d.send("task-received", uuid="u3") is not None   # the parent's still works


# -- receiver -----------------------------------------------------------------------------------
def test_receiver_gets_events_in_order_with_clocks_adjusted() -> None:
    app = Celeriac("t", broker=f"memory://{uuid.uuid4().hex}")
    received: list[dict[str, Any]] = []
    other: list[str] = []

    async def main() -> int:
        receiver = EventReceiver(app, {"task-received": received.append,
                                       "*": lambda e: other.append(e["type"])})
        async with receiver:
            d = EventDispatcher(app, hostname="w1@h")
            d.send("worker-online", freq=2.0)
            for i in range(150):
                d.send("task-received", uuid=f"u{i}")
            d.send("worker-offline")
            count = await receiver.acapture(limit=152, timeout=10)
            d.close()
            assert receiver.clock.value > 152
            return count

    assert asyncio.run(main()) == 152
    assert [e["uuid"] for e in received] == [f"u{i}" for i in range(150)]
    assert [e["clock"] for e in received] == list(range(2, 152))
    assert other == ["worker-online", "worker-offline"]
    assert all(e["local_received"] >= e["timestamp"] - 1 for e in received)


def test_receiver_skips_bad_payloads_and_survives_a_failing_handler(
        caplog: pytest.LogCaptureFixture) -> None:
    app = Celeriac("t", broker=f"memory://{uuid.uuid4().hex}")
    seen: list[str] = []

    def handler(event: dict[str, Any]) -> None:
        seen.append(event["uuid"])
        if event["uuid"] == "boom":
            raise RuntimeError("handler bug")

    async def main() -> int:
        receiver = EventReceiver(app, {"*": handler})
        async with receiver:
            t = app.transport
            t.broadcast(EVENTS_CHANNEL, b"not json")
            t.broadcast(EVENTS_CHANNEL, b'[1, {"no": "type"}]')
            t.broadcast(EVENTS_CHANNEL, b'{"type": "task-started", "uuid": "boom", "clock": 7}')
            t.broadcast(EVENTS_CHANNEL, b'{"type": "task-started", "uuid": "ok", "clock": 3}')
            count = await receiver.acapture(limit=2, timeout=5)
            assert receiver.malformed == 3
            assert receiver.clock.value == 9    # adjust(7) -> 8, adjust(3) -> 9
            return count

    assert asyncio.run(main()) == 2
    assert seen == ["boom", "ok"]
    assert "handler for task-started failed" in caplog.text


def test_receiver_capture_blocking_times_out_and_get_needs_open() -> None:
    app = Celeriac("t", broker=f"memory://{uuid.uuid4().hex}")
    receiver = EventReceiver(app)
    start = time.monotonic()
    assert receiver.capture(timeout=0.2) == 0
    assert 0.15 <= time.monotonic() - start < 5
    with pytest.raises(RuntimeError, match="before open"):
        asyncio.run(receiver.get(0.01))


class LibraryTransport(FakeTransport):
    """A broadcast that holds a lock inside the "client library" for a while, as
    sqlite3.connect or hiredis hold C-level mutexes."""

    def __init__(self) -> None:
        super().__init__()
        self.library = threading.Lock()
        self.inside = threading.Event()

    def broadcast(self, channel: str, payload: bytes, routing_key: str = "") -> None:
        with self.library:
            self.inside.set()
            time.sleep(0.3)  # sleep-ok: the time the library call takes
            super().broadcast(channel, payload, routing_key)


def test_fork_waits_for_the_sender_to_leave_the_client_library() -> None:
    transport = LibraryTransport()
    app = Celeriac("t", broker="memory://unused")
    d = EventDispatcher(app, hostname="w1@h", transport=transport)  # type: ignore[arg-type]
    try:
        d.send("worker-online")  # unbuffered: the sender enters broadcast at once
        assert transport.inside.wait(5)
        pid = os.fork()
        if pid == 0:  # had fork not waited, the library's lock would be held forever here
            os._exit(0 if transport.library.acquire(timeout=2) else 3)
        assert _exit_code(pid, "the child hung on a lock the sender thread held at fork") == 0
    finally:
        d.close(timeout=1)
