"""Group commit of concurrent publishes (``producer/batching.py``): many threads calling
``delay()`` at once share round trips, each returning once its own is confirmed.

On the shared Redis, under a namespace of the test's own; the stored messages are read
back through a consumer (``fetch``), so the test does not depend on the key layout. The
error paths drive ``GroupCommit`` with a flush of the test's own that holds a round trip
open until the callers it wants have queued behind it."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator, Sequence

import pytest

from celeriac import Celeriac
from celeriac.errors import BrokerUnavailable
from celeriac.producer import batching
from celeriac.protocol import Message
from celeriac.testing import wait_until
from celeriac.transports.base import Outgoing, Transport
from celeriac.transports.redis import RedisTransport
from tests.loops import run, track
from tests.services import require

THREADS = 16
PER_THREAD = 150


def stored_ids(transport: Transport, queue: str, expected: int) -> list[str]:
    """The task ids of every message in ``queue``, fetched by a consumer of the test's."""
    async def drain() -> list[str]:
        await transport.connect(f"reader-{uuid.uuid4().hex[:8]}")
        out: list[str] = []
        for _ in range(expected // 100 + 3):  # bounded: a few fetches past the expected
            got = await transport.fetch([queue], 500, 0.2)
            if not got:
                break
            out += [d.message.headers["id"] for d in got]
            await transport.ack(got)
        await transport.disconnect()
        return out

    return run(drain())


@pytest.fixture
def app() -> Iterator[Celeriac]:
    url = require("redis").rpartition("/")[0] + f"/0?namespace=gc-{uuid.uuid4().hex[:8]}"
    app = Celeriac("gc", broker=url, backend="memory://gc")
    yield app
    from tests.contracts.conftest import _drop_redis_namespace

    app.close()
    _drop_redis_namespace(url)


def in_threads(n: int, body: Callable[[int], None], timeout: float = 60) -> None:
    started = threading.Barrier(n)

    def work(i: int) -> None:
        started.wait()
        body(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a producer thread never returned"


def test_16_threads_store_every_message_once_and_share_round_trips(app: Celeriac) -> None:
    @app.task(name="gc.add")
    def add(x: int, y: int) -> int:
        return x + y

    ids: list[list[str]] = [[] for _ in range(THREADS)]
    in_threads(THREADS, lambda i: ids[i].extend(
        add.delay(i, j).id for j in range(PER_THREAD)))
    sent = [x for chunk in ids for x in chunk]
    assert len(set(sent)) == THREADS * PER_THREAD
    group = batching.for_publisher(app.publisher)
    assert group is not None
    assert group.messages == THREADS * PER_THREAD
    assert group.round_trips < group.messages, "no round trip carried two messages"
    transport = track(RedisTransport(app.settings.broker_url, app.settings))
    try:
        stored = stored_ids(transport, "celery", len(sent))
    finally:
        transport.close()
    assert sorted(stored) == sorted(sent)  # each once: nothing lost, nothing twice


class HeldFlush:
    """A flush that holds its first round trip open until released, and records each
    batch; ``fail(batch)`` says what a batch raises."""

    def __init__(self, fail: Callable[[Sequence[Outgoing]], Exception | None]) -> None:
        self.fail = fail
        self.batches: list[list[str]] = []
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, items: Sequence[Outgoing]) -> None:
        if not self.batches and not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(30)
        self.batches.append([i.queue for i in items])
        error = self.fail(items)
        if error is not None:
            raise error


def _queued(group: batching.GroupCommit, n: int) -> None:
    wait_until(lambda: len(group._queue) == n, 10, message=f"{n} callers queued")


def _caller(group: batching.GroupCommit, name: str, outcomes: dict[str, object]
            ) -> threading.Thread:
    def call() -> None:
        try:
            group.publish([Outgoing(name, Message({"id": name}, b""))])
            outcomes[name] = "stored"
        except Exception as exc:
            outcomes[name] = exc

    t = threading.Thread(target=call)
    t.start()
    return t


def _run_held(flush: HeldFlush, followers: int) -> dict[str, object]:
    """A leader ("lead") holds a round trip open while ``followers`` callers queue."""
    group = batching.GroupCommit(flush)
    outcomes: dict[str, object] = {}
    threads = [_caller(group, "lead", outcomes)]
    assert flush.entered.wait(10)
    threads += [_caller(group, f"f{i}", outcomes) for i in range(followers)]
    _queued(group, followers)
    flush.release.set()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    return outcomes


def test_queued_callers_go_in_one_round_trip_after_the_first() -> None:
    flush = HeldFlush(lambda items: None)
    outcomes = _run_held(flush, 5)
    assert flush.batches[0] == ["lead"]
    assert sorted(flush.batches[1]) == [f"f{i}" for i in range(5)]
    assert len(flush.batches) == 2
    assert set(outcomes.values()) == {"stored"}


def test_a_lost_round_trip_fails_exactly_the_callers_it_carried() -> None:
    def fail(items: Sequence[Outgoing]) -> Exception | None:
        return BrokerUnavailable("down") if items[0].queue != "lead" else None

    outcomes = _run_held(HeldFlush(fail), 4)
    assert outcomes["lead"] == "stored"
    for i in range(4):
        assert isinstance(outcomes[f"f{i}"], BrokerUnavailable)


def test_a_bad_message_fails_its_own_caller_only() -> None:
    # Any error other than a lost broker: each caller of the batch sends its own alone.
    def fail(items: Sequence[Outgoing]) -> Exception | None:
        return ValueError("bad f2") if any(i.queue == "f2" for i in items) else None

    flush = HeldFlush(fail)
    outcomes = _run_held(flush, 4)
    assert isinstance(outcomes["f2"], ValueError)
    assert {k for k, v in outcomes.items() if v == "stored"} == {"lead", "f0", "f1", "f3"}
    assert sorted(b for b in flush.batches[2:] if b != ["f2"]) == [["f0"], ["f1"], ["f3"]]
