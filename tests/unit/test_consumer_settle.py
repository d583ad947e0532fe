"""The consumer's pump on the memory transport: results are stored before their messages
are acked, a failing result store holds the acks back, fetches come in batches, and a
backlog is polled for rather than woken for message by message."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from celeriac import Celeriac
from celeriac.backends.base import Stored, register
from celeriac.backends.memory import MemoryBackend
from celeriac.protocol import Delivery
from celeriac.testing import ThreadedWorker, wait_until


class FlakyBackend(MemoryBackend):
    """A memory store whose batch writes fail while ``broken`` is set."""

    scheme = "flaky"
    broken = threading.Event()
    network = True  # stored from the consumer's thread, as a network backend would be


register("flaky", FlakyBackend)


def _flaky_store_many(self: FlakyBackend, items: Sequence[Stored]) -> None:
    if FlakyBackend.broken.is_set():
        raise ConnectionError("result store down (test)")
    MemoryBackend.store_many(self, items)


FlakyBackend.store_many = _flaky_store_many  # type: ignore[method-assign]


@pytest.fixture
def app() -> Iterator[Celeriac]:
    name = uuid.uuid4().hex
    app = Celeriac("t", broker=f"memory://{name}", backend=f"flaky://{name}",
                   worker_lease_timeout=2.0)
    FlakyBackend.broken.clear()
    yield app
    FlakyBackend.broken.clear()
    app.close()


def _record(app: Celeriac) -> list[tuple[str, list[str]]]:
    """Log ("store", task ids) and ("ack", task ids) as the worker makes those calls."""
    log: list[tuple[str, list[str]]] = []
    transport, backend = app.transport, app.backend
    real_ack, real_store = transport.ack, backend.store_many

    async def ack(deliveries: Sequence[Delivery]) -> None:
        await real_ack(deliveries)
        log.append(("ack", [d.message.headers["id"] for d in deliveries]))

    def store_many(items: Sequence[Stored]) -> None:
        real_store(items)
        log.append(("store", [i.task_id for i in items]))

    transport.ack = ack  # type: ignore[method-assign]
    backend.store_many = store_many  # type: ignore[method-assign]
    return log


def test_every_result_is_stored_before_its_message_is_acked(app: Celeriac) -> None:
    @app.task
    def double(x: int) -> int:
        return 2 * x

    log = _record(app)
    results = double.delay_many([(i,) for i in range(50)])
    with ThreadedWorker(app):
        assert [r.get(timeout=5) for r in results] == [2 * i for i in range(50)]
        wait_until(lambda: sum(len(ids) for op, ids in log if op == "ack") == 50, 5)
    stored: set[str] = set()
    for op, ids in log:
        if op == "store":
            stored.update(ids)
        else:
            assert set(ids) <= stored, f"acked before its result was stored: {ids}"


def test_a_failing_result_store_holds_the_ack_back_until_it_recovers(app: Celeriac) -> None:
    @app.task
    def one() -> int:
        return 1

    log = _record(app)
    FlakyBackend.broken.set()
    with ThreadedWorker(app) as w:
        r = one.delay()
        wait_until(lambda: w.worker.processed == 1, 5, message="task ran")
        wait_until(lambda: w.worker.consumer.pump.failures >= 1, 5, message="store failed")
        assert not log  # neither stored nor acked while the store is down
        assert app.transport.queue_length("celery") == 0  # still owned by the worker
        FlakyBackend.broken.clear()
        assert r.get(timeout=10) == 1
        wait_until(lambda: ("ack", [r.id]) in log, 5, message="acked after the store")
    assert log.index(("store", [r.id])) < log.index(("ack", [r.id]))


def test_fetches_come_in_batches_at_the_low_water_mark(app: Celeriac) -> None:
    @app.task
    def nothing() -> None: ...

    limits: list[int] = []
    real_fetch = app.transport.fetch

    async def fetch(queues: Sequence[str], limit: int, timeout: float) -> Any:
        got = await real_fetch(queues, limit, timeout)
        if got:
            limits.append(limit)
        return got

    app.transport.fetch = fetch  # type: ignore[method-assign]
    results = nothing.delay_many([()] * 40)
    with ThreadedWorker(app):  # solo: prefetch 4, low-water mark 2
        for r in results:
            r.get(timeout=5)
    assert sum(limits) >= 40 and min(limits) >= 2, limits
    assert len(limits) <= 21, limits


def test_a_backlog_is_polled_for_and_an_empty_poll_brings_the_sleeper_back() -> None:
    """A fetch that finds several messages as the queues run dry means a wake-up per
    message falls behind: the pump polls (its acks riding along) until a poll finds
    nothing. A lone task, an idle worker's round trip, is woken for and never polled."""
    name = uuid.uuid4().hex
    app = Celeriac("t", broker=f"memory://{name}", backend=f"memory://{name}",
                   worker_prefetch_multiplier=8)  # solo: the sleeper asks for up to 8
    try:
        calls = _polls_and_wakes(app)
    finally:
        app.close()
    burst = calls.index(("woke", 4))
    after = calls[burst + 1:calls.index(("wait", -1), burst)]
    assert after and all(kind == "fetch" for kind, _ in after), calls  # polled
    assert after[-1] == ("fetch", 0), calls  # until a poll found nothing


def _polls_and_wakes(app: Celeriac) -> list[tuple[str, int]]:
    """A lone task, then a burst of four, through a worker on ``app``; its fetches and
    the sleeper's waits, in order (what each brought)."""
    @app.task
    def nothing() -> None: ...

    calls: list[tuple[str, int]] = []
    transport = app.transport
    real_poll, real_wait = transport.settle_and_fetch, transport.wait_ready

    async def settle_and_fetch(acks: Sequence[Delivery], results: Sequence[Stored],
                               namespace: str | None, queues: Sequence[str], limit: int
                               ) -> list[Delivery]:
        got = await real_poll(acks, results, namespace, queues, limit)
        if limit:
            calls.append(("fetch", len(got)))
        return got

    async def wait_ready(queues: Sequence[str], limit: int, timeout: float
                         ) -> list[Delivery] | None:
        calls.append(("wait", -1))
        got = await real_wait(queues, limit, timeout)
        calls.append(("woke", len(got or [])))
        return got

    transport.settle_and_fetch = settle_and_fetch  # type: ignore[method-assign]
    transport.wait_ready = wait_ready  # type: ignore[method-assign]
    with ThreadedWorker(app):
        wait_until(lambda: ("wait", -1) in calls, 5, message="the sleeper waits")
        nothing.delay().get(timeout=5)
        lone = calls.index(("woke", 1))
        wait_until(lambda: len(calls) > lone + 1, 5)
        assert calls[lone + 1] == ("wait", -1), calls  # woken again, not polled
        for r in nothing.delay_many([()] * 4):  # one publish: the wake finds all four
            r.get(timeout=5)
        burst = calls.index(("woke", 4))
        wait_until(lambda: ("wait", -1) in calls[burst:], 5, message="asleep again")
    return calls
