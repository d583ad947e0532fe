"""The contract every transport keeps (see ``celeriac.transports.base``).

Each test runs once per transport through the ``transport`` fixture (``conftest.py``).
Consumer-side methods are coroutines: each test runs one scenario with ``tests.loops.run``.
"""

from __future__ import annotations

import asyncio
import copy
import multiprocessing
import os
import random
import threading
import time
from collections.abc import Sequence
from typing import Any, TypeVar

import pytest

from celeriac.errors import MessageTooLarge
from celeriac.protocol import Delivery, Message
from celeriac.settings import Settings
from celeriac.transports.base import Outgoing, Transport, create_transport
from tests.loops import run

from .conftest import TransportFactory

T = TypeVar("T")

Q = "contract"
LEASE = 0.3
"""``worker_lease_timeout`` for the lease tests."""
IDLE = 0.15
"""How long a consumer is left idle in its fetch before the event that must wake it."""
WAKE_LATENCY = 0.5
"""An idle fetch returns within this long after a publish. What is checked is the
mechanism, a woken wait: without one the fetch would return at its 5 s timeout (at the
SQLite transport's 1 s recheck, 0.85 s after the publish). Woken, it returns in a few
milliseconds, and this bound leaves room for a loaded machine's scheduling (kombu's
layout polls, at most 100 ms apart, which is inside it too). SQS's is ``SQS_WAKE_LATENCY``
(``wake_latency``)."""
SQS_WAKE_LATENCY = 2.0
"""SQS (moto's server) answers a long poll's wait in tens of milliseconds a call, and
0.73 s was seen on a loaded machine: still far from the 5 s of a wait not woken."""


def wake_latency(transport: TransportFactory) -> float:
    return SQS_WAKE_LATENCY if transport.name == "sqs" else WAKE_LATENCY
SLACK = 1.5
"""How much later than asked a timed wait may return: room for a loaded machine's
scheduling (1.27 s late was seen with the suite, two CPU hogs and other work on 2 CPUs),
still far below what a wait that is not woken would take (its 5 s timeout)."""
DELAY = 0.6
"""A delayed message's delay: long enough that a check made right after the publish
(0.1 s) still sees it held on a loaded machine."""
EARLY = 0.01
"""Clock granularity allowed when checking that a wait did not end too early."""

mp = multiprocessing.get_context("fork")


def message(n: int, *, priority: int = 0, body: bytes | None = None) -> Message:
    return Message(
        headers={"task": "contract.task", "id": f"id-{n}", "n": n},
        body=f"body-{n}".encode() if body is None else body,
        properties={"priority": priority},
    )


def unwrap(t: TransportFactory, got: Message, sent: Message) -> Message:
    """``got`` without what the transport's layout adds to every message (``Layout``) and
    ``sent`` did not carry: compared with ``sent``, only the message itself is checked."""
    layout = t.layout
    if not (layout.envelope or layout.redelivery_headers):
        return got
    return Message(
        {k: v for k, v in got.headers.items()
         if k in sent.headers or k not in layout.redelivery_headers},
        got.body, got.content_type, got.content_encoding,
        {k: v for k, v in got.properties.items()
         if k in sent.properties or k not in layout.envelope})


def step(t: TransportFactory, priority: int) -> int:
    """The order key of ``priority`` on ``t``: lower comes first."""
    steps = t.layout.priority_steps
    if steps is None:
        return -priority
    return max(s for s in steps if s <= priority)


def skip_unless_delays_in_broker(t: TransportFactory) -> None:
    if not t.layout.delays_in_broker:
        pytest.skip(f"{t.name}: a producer's countdown goes out at once with its eta "
                    "header and the worker parks it, as Celery's do "
                    "(tests/compat/test_kombu_layout.py)")


def ids(deliveries: Sequence[Delivery]) -> list[str]:
    return [d.message.headers["id"] for d in deliveries]


async def fetch_n(t: Transport, queues: Sequence[str], n: int, timeout: float = 2.0
                  ) -> list[Delivery]:
    """Fetch until ``n`` deliveries arrived or ``timeout`` passed."""
    out: list[Delivery] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        out += await t.fetch(queues, n - len(out), remaining)
    return out


async def consumer(transport: TransportFactory, name: str, **settings: Any) -> Transport:
    t = transport(**settings)
    await t.connect(name)
    return t


# -- publish and fetch ------------------------------------------------------------------

def test_round_trip_keeps_message_exact(transport: TransportFactory) -> None:
    sent = [
        Message(
            headers={"task": "contract.täsk", "id": "ü-1", "nested": {"a": [1, 2.5, None, True]},
                     "eta": None, "retries": 3, "emoji": "\U0001f955"},
            body=bytes(range(256)) * 3,
            content_type="application/x-msgpack",
            content_encoding="binary",
            properties={"priority": 0, "correlation_id": "ü-1", "reply_to": None,
                        "delivery_mode": 2},
        ),
        Message(headers={"task": "t", "id": "2"}, body=b"", properties={"priority": 0}),
    ]
    producer = transport()
    for m in sent:
        producer.publish(Q, m)

    async def scenario() -> list[Delivery]:
        c = await consumer(transport, "c1")
        return await fetch_n(c, [Q], 2)

    got = run(scenario())
    assert [unwrap(transport, d.message, m) for d, m in zip(got, sent, strict=True)] == sent
    for d in got:
        assert type(d.message.body) is bytes
        assert d.queue == Q
        assert d.delivery_count == 1


def test_broker_keeps_the_message_as_published(transport: TransportFactory) -> None:
    """What the broker holds is a snapshot: later changes to the producer's or the
    consumer's ``Message`` objects do not reach it (as with any out-of-process broker)."""

    def fresh() -> Message:
        return Message(headers={"task": "t", "id": "1", "trail": ["a"]}, body=b"x",
                       properties={"priority": 1})

    m = fresh()
    transport().publish(Q, m)
    m.headers["id"] = "changed"
    m.headers["trail"].append("producer")
    m.properties["priority"] = 9

    async def scenario() -> tuple[Message, Message]:
        c = await consumer(transport, "c1")
        [d] = await c.fetch([Q], 1, 1.0)
        delivered = copy.deepcopy(d.message)
        d.message.headers["trail"].append("consumer")
        d.message.headers["retries"] = 1
        await c.requeue([d], redelivered=False)
        [again] = await c.fetch([Q], 1, 1.0)
        return delivered, again.message

    delivered, again = run(scenario())
    assert unwrap(transport, delivered, fresh()) == fresh()
    assert unwrap(transport, again, fresh()) == fresh()


def test_fifo_within_a_priority(transport: TransportFactory) -> None:
    producer = transport()
    for n in range(20):
        producer.publish(Q, message(n, priority=4))

    async def scenario() -> list[Delivery]:
        c = await consumer(transport, "c1")
        one_by_one = [d for _ in range(10) for d in await c.fetch([Q], 1, 1.0)]
        batch = await c.fetch([Q], 100, 1.0)
        return one_by_one + batch

    assert ids(run(scenario())) == [f"id-{n}" for n in range(20)]


def test_higher_priority_first(transport: TransportFactory) -> None:
    rng = random.Random(7)
    priorities = [p for p in range(10) for _ in range(3)]
    rng.shuffle(priorities)
    producer = transport()
    for n, p in enumerate(priorities):
        producer.publish(Q, message(n, priority=p))
    order = sorted(enumerate(priorities), key=lambda e: (step(transport, e[1]), e[0]))
    expected = [f"id-{n}" for n, _ in order]

    async def scenario() -> list[Delivery]:
        c = await consumer(transport, "c1")
        first = [d for _ in range(5) for d in await c.fetch([Q], 1, 1.0)]
        # The rest may come in several fetches (AMQP streams them in as they arrive).
        return first + await fetch_n(c, [Q], len(priorities) - len(first), 5.0)

    got = run(scenario())
    assert ids(got) == expected
    assert [d.message.priority for d in got] == [p for _, p in order]


def test_fetch_from_several_queues_takes_only_those(transport: TransportFactory) -> None:
    producer = transport()
    producer.publish("a", message(1))
    producer.publish("b", message(2))
    producer.publish("other", message(3))
    producer.publish("a", message(4))

    async def scenario() -> tuple[list[Delivery], list[Delivery]]:
        c = await consumer(transport, "c1")
        got = await fetch_n(c, ["a", "b"], 3)
        more = await c.fetch(["a", "b"], 10, 0.05)
        return got, more

    got, more = run(scenario())
    assert sorted((d.queue, d.message.headers["id"]) for d in got) == [
        ("a", "id-1"), ("a", "id-4"), ("b", "id-2")]
    assert more == []
    assert producer.queue_length("other") == 1
    assert producer.queue_length("a") == producer.queue_length("b") == 0


def test_priority_applies_across_queues(transport: TransportFactory) -> None:
    producer = transport()
    producer.publish("a", message(1, priority=1))
    producer.publish("b", message(2, priority=8))
    producer.publish("a", message(3, priority=8))

    async def scenario() -> list[Delivery]:
        c = await consumer(transport, "c1")
        return [d for _ in range(3) for d in await c.fetch(["a", "b"], 1, 1.0)]

    # kombu's Redis: the lowest step first; within a step, the queues in the order given.
    expected = ["id-2", "id-3", "id-1"] if transport.layout.priority_steps is None else \
        ["id-1", "id-3", "id-2"]
    assert ids(run(scenario())) == expected


def test_fetch_respects_limit(transport: TransportFactory) -> None:
    producer = transport()
    for n in range(10):
        producer.publish(Q, message(n))

    async def scenario() -> list[list[Delivery]]:
        c = await consumer(transport, "c1")
        return [await c.fetch([Q], 3, 1.0), await c.fetch([Q], 1, 1.0)]

    three, one = run(scenario())
    assert ids(three) == ["id-0", "id-1", "id-2"]
    assert ids(one) == ["id-3"]
    assert producer.queue_length(Q) == 6


def test_empty_fetch_returns_nothing_after_about_the_timeout(transport: TransportFactory
                                                             ) -> None:
    async def scenario() -> tuple[list[Delivery], float, list[Delivery], float]:
        c = await consumer(transport, "c1")
        t0 = time.monotonic()
        got = await c.fetch([Q], 10, 0.3)
        waited = time.monotonic() - t0
        t0 = time.monotonic()
        none = await c.fetch([Q], 10, 0.0)
        return got, waited, none, time.monotonic() - t0

    got, waited, none, immediate = run(scenario())
    assert got == [] and none == []
    assert 0.3 - EARLY <= waited < 0.3 + SLACK
    assert immediate < SLACK


# -- waking an idle consumer ------------------------------------------------------------

def _idle_fetch(transport: TransportFactory, fetching: Any) -> tuple[list[Delivery], float]:
    """Connect, signal ``fetching``, block in one long fetch; (deliveries, return time)."""

    async def scenario() -> tuple[list[Delivery], float]:
        c = await consumer(transport, "idle")
        fetching.set()
        got = await c.fetch([Q], 10, 5.0)
        return got, time.monotonic()

    return run(scenario())


def _publish_once_fetching(producer: Transport, fetching: threading.Event
                           ) -> tuple[threading.Thread, list[float]]:
    """A thread that publishes one message once the consumer sleeps in its fetch; the
    list gets the time it was published."""
    published_at: list[float] = []

    def publish_later() -> None:
        assert fetching.wait(5)
        time.sleep(IDLE)  # sleep-ok: let the consumer fall asleep in its fetch: that is the point
        producer.publish(Q, message(1))
        published_at.append(time.monotonic())

    thread = threading.Thread(target=publish_later)
    thread.start()
    return thread, published_at


def test_idle_fetch_wakes_on_publish_from_another_thread(transport: TransportFactory) -> None:
    producer = transport()  # its own instance (and, for a real broker, its own connection)
    fetching = threading.Event()
    thread, published_at = _publish_once_fetching(producer, fetching)
    try:
        got, returned_at = _idle_fetch(transport, fetching)
    finally:
        thread.join(10)
    assert ids(got) == ["id-1"]
    assert returned_at - published_at[0] < wake_latency(transport)


def _publish_later_in_child(url: str, fetching: Any, out: Any) -> None:
    producer = create_transport(url, Settings(broker_url=url))
    assert fetching.wait(5)
    time.sleep(IDLE)  # sleep-ok: let the consumer fall asleep in its fetch: that is the point
    producer.publish(Q, message(1))
    out.put(time.monotonic())  # CLOCK_MONOTONIC is system-wide: comparable across processes
    producer.close()


def test_idle_fetch_wakes_on_publish_from_another_process(transport: TransportFactory) -> None:
    if transport.process_local:
        pytest.skip(f"{transport.name}:// cannot be shared between processes")
    fetching, out = mp.Event(), mp.Queue()
    child = mp.Process(target=_publish_later_in_child, args=(transport.url, fetching, out))
    child.start()
    try:
        got, returned_at = _idle_fetch(transport, fetching)
        published_at = out.get(timeout=5)
    finally:
        child.join(10)
    assert child.exitcode == 0
    assert ids(got) == ["id-1"]
    assert returned_at - published_at < wake_latency(transport)


def test_consumer_connecting_right_after_a_publish_wakes_on_the_next(
        transport: TransportFactory) -> None:
    """A producer that has published before must still reach consumers that came later."""
    producer = transport()
    fetching = threading.Event()

    async def scenario() -> tuple[list[Delivery], float]:
        await consumer(transport, "early-1")
        producer.publish("warm-up", message(0))  # the producer has now seen "early-1"
        await consumer(transport, "early-2")
        producer.publish("warm-up", message(1))  # ...and "early-2", a moment ago
        late = await consumer(transport, "late")  # connects right after that publish
        fetching.set()
        got = await late.fetch([Q], 10, 5.0)
        return got, time.monotonic()

    thread, published_at = _publish_once_fetching(producer, fetching)
    try:
        got, returned_at = run(scenario())
    finally:
        thread.join(10)
    assert ids(got) == ["id-1"]
    assert returned_at - published_at[0] < wake_latency(transport)


def test_requeue_wakes_an_idle_consumer(transport: TransportFactory) -> None:
    transport().publish(Q, message(1))

    async def scenario() -> tuple[list[Delivery], float]:
        holder = await consumer(transport, "holder")
        [d] = await holder.fetch([Q], 1, 1.0)
        idle = await consumer(transport, "idle")

        async def give_back() -> float:
            await asyncio.sleep(IDLE)  # sleep-ok: let the other consumer fall asleep in its fetch
            await holder.requeue([d], redelivered=False)
            return time.monotonic()

        task = asyncio.ensure_future(give_back())
        got = await idle.fetch([Q], 1, 5.0)
        returned_at = time.monotonic()
        return got, returned_at - await task

    got, latency = run(scenario())
    assert ids(got) == ["id-1"]
    assert latency < wake_latency(transport)


# -- ack, requeue, dead letters ---------------------------------------------------------

def test_delivery_count_starts_at_one(transport: TransportFactory) -> None:
    transport().publish_many([Outgoing(Q, message(n)) for n in range(3)])

    async def scenario() -> list[Delivery]:
        return await fetch_n(await consumer(transport, "c1"), [Q], 3)

    assert [d.delivery_count for d in run(scenario())] == [1, 1, 1]


def test_ack_removes_for_good(transport: TransportFactory) -> None:
    producer = transport()
    producer.publish(Q, message(1))
    producer.publish(Q, message(2))

    async def scenario() -> tuple[list[Delivery], list[Delivery]]:
        a = await consumer(transport, "a")
        got = await fetch_n(a, [Q], 2)
        await a.ack([d for d in got if d.message.headers["id"] == "id-1"])
        await a.disconnect()  # the unacked one goes back, the acked one must not
        b = await consumer(transport, "b")
        return got, await b.fetch([Q], 10, 0.2)

    got, later = run(scenario())
    assert ids(got) == ["id-1", "id-2"]
    assert ids(later) == ["id-2"]
    assert producer.queue_length(Q) == 0


def test_requeue_not_redelivered_keeps_the_delivery_count(transport: TransportFactory) -> None:
    transport().publish(Q, message(1))

    async def scenario() -> list[int]:
        c = await consumer(transport, "c1")
        counts = []
        [d] = await c.fetch([Q], 1, 1.0)
        counts.append(d.delivery_count)
        for _ in range(2):
            await c.requeue([d], redelivered=False)
            [d] = await c.fetch([Q], 1, 1.0)
            counts.append(d.delivery_count)
        return counts

    assert run(scenario()) == [1, 1, 1]


def test_requeue_redelivered_counts_the_delivery(transport: TransportFactory) -> None:
    producer = transport()
    producer.publish(Q, message(1))

    async def scenario() -> list[Delivery]:
        c = await consumer(transport, "c1")
        seen = list(await c.fetch([Q], 1, 1.0))
        for _ in range(2):
            await c.requeue(seen[-1:], redelivered=True)
            seen += await c.fetch([Q], 1, 1.0)
        return seen

    seen = run(scenario())
    assert [d.delivery_count for d in seen] == [1, 2, 3]
    assert all(unwrap(transport, d.message, message(1)) == message(1) for d in seen)


def test_requeue_with_a_delay_holds_it_in_the_delay_store(transport: TransportFactory) -> None:
    """A lost delivery's backoff: the message comes back after the delay, counted once,
    and a sleeping consumer wakes for it without a publish."""
    producer = transport()
    producer.publish(Q, message(1))

    async def scenario() -> tuple[float, list[Delivery]]:
        c = await consumer(transport, "c1")
        [d] = await c.fetch([Q], 1, 1.0)
        t0 = time.monotonic()
        await c.requeue([d], redelivered=True, delay=DELAY)
        assert await c.fetch([Q], 1, 0.1) == []
        got = await fetch_n(c, [Q], 1, 5.0)
        return time.monotonic() - t0, got

    waited, got = run(scenario())
    assert ids(got) == ["id-1"]
    assert got[0].delivery_count == 2
    assert unwrap(transport, got[0].message, message(1)) == message(1)
    assert DELAY - EARLY <= waited < DELAY + SLACK


def test_dead_letter_moves_the_message_out_for_good(transport: TransportFactory) -> None:
    producer = transport()
    for n in range(3):
        producer.publish(Q, message(n))

    async def scenario() -> list[Delivery]:
        a = await consumer(transport, "a")
        got = await fetch_n(a, [Q], 3)
        for d, reason in zip(got, ["bad input", "too many deliveries", "rejected"],
                             strict=True):
            await a.dead_letter(d, reason)
        await a.disconnect()
        b = await consumer(transport, "b")
        return await b.fetch([Q], 10, 0.2)

    assert run(scenario()) == []
    assert producer.queue_length(Q) == 0
    dead = producer.dead_letters()
    assert [(x.queue, x.reason, unwrap(transport, x.message, message(n)), x.delivery_count)
            for n, x in enumerate(dead)] == [
        (Q, "bad input", message(0), 1),
        (Q, "too many deliveries", message(1), 1),
        (Q, "rejected", message(2), 1),
    ]
    assert all(x.dead_at <= time.time() for x in dead)
    assert [unwrap(transport, x.message, message(n))
            for n, x in enumerate(producer.dead_letters(limit=2))] == [message(0), message(1)]


# -- leases -----------------------------------------------------------------------------

def test_expired_lease_returns_messages_through_another_heartbeat(
        transport: TransportFactory) -> None:
    if not transport.layout.leases:
        pytest.skip(f"{transport.name}: kombu's visibility timeout returns a silent "
                    "consumer's messages (tests/compat/test_kombu_layout.py)")
    producer = transport()
    producer.publish(Q, message(1))
    producer.publish(Q, message(2))

    async def scenario() -> None:
        t_lease = time.monotonic()
        dead = await consumer(transport, "dead", worker_lease_timeout=LEASE)
        live = await consumer(transport, "live", worker_lease_timeout=LEASE)
        taken = await fetch_n(dead, [Q], 2)
        assert [d.delivery_count for d in taken] == [1, 1]
        # "dead" never heartbeats again; "live" keeps heartbeating until they come back.
        restored = 0
        deadline = time.monotonic() + 10 * LEASE
        while not restored and time.monotonic() < deadline:
            assert await live.fetch([Q], 10, LEASE / 6) == []
            restored = await live.renew_lease()
        assert time.monotonic() - t_lease >= LEASE - EARLY
        assert restored == 2
        assert producer.queue_length(Q) == 2
        again = await fetch_n(live, [Q], 2)
        assert [d.message for d in again] == [message(1), message(2)]
        assert [d.delivery_count for d in again] == [2, 2]
        assert await live.renew_lease() == 0
        # The dead consumer, back from the dead, can no longer ack them away.
        await dead.ack(taken)
        await live.requeue(again, redelivered=False)
        assert [d.message for d in await fetch_n(live, [Q], 2)] == [message(1), message(2)]

    run(scenario())


@pytest.mark.slow  # waits out a delay or a lease: kept out of the fast tier
def test_live_consumer_keeps_its_messages_past_the_lease(transport: TransportFactory) -> None:
    transport().publish(Q, message(1))

    # Three times the usual lease: "busy" must renew within it, and one turn of the loop
    # below (two renewals and a short fetch) took longer than 0.3 s on a loaded machine.
    lease = 3 * LEASE

    async def scenario() -> None:
        busy = await consumer(transport, "busy", worker_lease_timeout=lease)
        other = await consumer(transport, "other", worker_lease_timeout=lease)
        [d] = await busy.fetch([Q], 1, 1.0)
        end = time.monotonic() + 2.5 * lease
        while time.monotonic() < end:  # a long task: "busy" heartbeats, "other" polls
            await busy.renew_lease()
            assert await other.renew_lease() == 0
            assert await other.fetch([Q], 10, LEASE / 4) == []
        await busy.ack([d])
        assert await other.renew_lease() == 0
        assert await other.fetch([Q], 10, 0.05) == []

    run(scenario())


def test_disconnect_returns_owned_messages_uncounted(transport: TransportFactory) -> None:
    producer = transport()
    for n in range(3):
        producer.publish(Q, message(n))

    async def scenario() -> None:
        a = await consumer(transport, "a")
        got = await fetch_n(a, [Q], 2)
        assert producer.queue_length(Q) == 1
        await a.disconnect()
        assert producer.queue_length(Q) == 3
        b = await consumer(transport, "b")
        again = await fetch_n(b, [Q], 3)
        assert ids(again) == ["id-0", "id-1", "id-2"]
        assert [d.delivery_count for d in again] == [1, 1, 1]
        assert ids(got) == ["id-0", "id-1"]

    run(scenario())


# -- administration ---------------------------------------------------------------------

def test_ping_answers_on_a_working_broker(transport: TransportFactory) -> None:
    transport().ping()


def test_queue_length_counts_ready_messages_only(transport: TransportFactory) -> None:
    producer = transport()
    assert producer.queue_length(Q) == 0
    for n in range(3):
        producer.publish(Q, message(n))
    producer.publish(Q, message(9), delay=30)
    producer.publish("elsewhere", message(10))
    # Where a countdown travels in the message (kombu's layout), it is ready until a
    # worker takes and parks it.
    delayed = 0 if transport.layout.delays_in_broker else 1
    assert producer.queue_length(Q) == 3 + delayed

    async def scenario() -> None:
        c = await consumer(transport, "c1")
        await c.fetch([Q], 1, 1.0)
        assert producer.queue_length(Q) == 2 + delayed

    run(scenario())


DELAYED = 1.0


@pytest.mark.slow  # waits out a delay or a lease: kept out of the fast tier
def test_purge_removes_ready_and_delayed_of_that_queue_only(transport: TransportFactory
                                                            ) -> None:
    producer = transport()
    for n in range(3):
        producer.publish(Q, message(n))
    # Due well after the purge: on AMQP a message that comes due moves from its delay
    # queue to its queue through an exchange, and a purge during that hop misses it.
    producer.publish(Q, message(3), delay=DELAYED)
    producer.publish("keep", message(4))
    producer.publish("keep", message(5), delay=DELAYED)

    async def scenario() -> None:
        c = await consumer(transport, "c1")
        [owned] = await c.fetch([Q], 1, 1.0)
        assert producer.purge(Q) == 3  # two ready, one delayed; not the owned one
        assert producer.queue_length(Q) == 0
        # The delayed one is gone too: it does not show up once due.
        assert await c.fetch([Q], 10, DELAYED + 0.3) == []
        # The owned one was not purged.
        await c.requeue([owned], redelivered=False)
        assert ids(await c.fetch([Q], 10, 1.0)) == ["id-0"]
        assert ids(await fetch_n(c, ["keep"], 2)) == ["id-4", "id-5"]
        assert producer.purge(Q) == 0

    run(scenario())


def test_publish_many_publishes_all(transport: TransportFactory) -> None:
    producer = transport()
    items = [Outgoing("a" if n % 2 else "b", message(n, priority=n % 3)) for n in range(9)]
    producer.publish_many(items)
    producer.publish_many([])
    assert producer.queue_length("a") == 4
    assert producer.queue_length("b") == 5

    async def scenario() -> list[Delivery]:
        return await fetch_n(await consumer(transport, "c1"), ["a", "b"], 9)

    got = run(scenario())
    assert len(got) == len(items)
    sent = {i.message.headers["id"]: i.message for i in items}
    assert {d.message.headers["id"]: (d.queue, unwrap(transport, d.message,
                                                      sent[d.message.headers["id"]]))
            for d in got} == {i.message.headers["id"]: (i.queue, i.message) for i in items}


def test_message_larger_than_max_size_is_refused_and_nothing_published(
        transport: TransportFactory) -> None:
    producer = transport(max_message_size=64)
    small, big = message(1, body=b"x" * 10), message(2, body=b"y" * 65)
    with pytest.raises(MessageTooLarge):
        producer.publish(Q, big)
    with pytest.raises(MessageTooLarge):
        producer.publish_many([Outgoing(Q, small), Outgoing(Q, big), Outgoing(Q, small)])
    with pytest.raises(MessageTooLarge):
        producer.publish(Q, big, delay=0.05)
    assert producer.queue_length(Q) == 0
    producer.publish(Q, message(3, body=b"z" * 64))  # exactly the limit is fine
    assert producer.queue_length(Q) == 1

    async def scenario() -> list[Delivery]:
        c = await consumer(transport, "c1", max_message_size=64)
        return await c.fetch([Q], 10, 0.2)

    assert ids(run(scenario())) == ["id-3"]


# -- delayed messages -------------------------------------------------------------------

def test_delayed_message_is_held_until_due(transport: TransportFactory) -> None:
    skip_unless_delays_in_broker(transport)
    producer = transport()

    async def scenario() -> tuple[float, list[Delivery]]:
        c = await consumer(transport, "c1")
        t0 = time.monotonic()
        producer.publish(Q, message(1), delay=DELAY)
        assert producer.queue_length(Q) == 0
        assert await c.fetch([Q], 10, 0.1) == []
        got = await c.fetch([Q], 10, 5.0)  # blocks; no new publish will wake it
        return time.monotonic() - t0, got

    waited, got = run(scenario())
    assert ids(got) == ["id-1"]
    assert got[0].delivery_count == 1
    assert DELAY - EARLY <= waited < DELAY + SLACK


def test_idle_fetch_returns_a_delayed_message_published_while_it_waits(
        transport: TransportFactory) -> None:
    skip_unless_delays_in_broker(transport)
    producer = transport()

    async def scenario() -> tuple[list[Delivery], float]:
        c = await consumer(transport, "c1")

        async def publish_later() -> float:
            await asyncio.sleep(IDLE / 2)  # sleep-ok: let the consumer fall asleep in its fetch
            # Taken before the call: the delay runs from the broker's moment in it, and
            # on a loaded machine the call may return late.
            began = time.monotonic()
            producer.publish(Q, message(1), delay=0.3)
            return began

        task = asyncio.ensure_future(publish_later())
        got = await c.fetch([Q], 10, 3.0)
        return got, time.monotonic() - await task

    got, waited = run(scenario())
    assert ids(got) == ["id-1"]
    assert 0.3 - EARLY <= waited < 0.3 + SLACK


def test_delayed_message_does_not_block_ready_ones(transport: TransportFactory) -> None:
    skip_unless_delays_in_broker(transport)
    producer = transport()
    producer.publish(Q, message(1, priority=9), delay=30)
    producer.publish(Q, message(2))

    async def scenario() -> list[Delivery]:
        c = await consumer(transport, "c1")
        return await c.fetch([Q], 10, 1.0)

    assert ids(run(scenario())) == ["id-2"]


# -- several processes ------------------------------------------------------------------

def _consume_until_empty(url: str, start: Any, out: Any) -> None:
    async def main() -> list[tuple[str, int]]:
        t = create_transport(url, Settings(broker_url=url))
        await t.connect(f"proc-{os.getpid()}")
        start.wait(10)  # all consumers start together
        seen: list[tuple[str, int]] = []
        while True:
            batch = await t.fetch([Q], 5, 0.3)
            if not batch:
                break
            seen += [(d.message.headers["id"], d.delivery_count) for d in batch]
            await asyncio.sleep(0.002)  # sleep-ok: "work", so the consumers interleave
            await t.ack(batch)
        await t.disconnect()
        t.close()
        return seen

    out.put(asyncio.run(main()))


def test_processes_sharing_the_broker_never_get_the_same_message(
        transport: TransportFactory) -> None:
    if transport.process_local:
        pytest.skip(f"{transport.name}:// cannot be shared between processes")
    total = 500
    transport().publish_many([Outgoing(Q, message(n)) for n in range(total)])
    start, out = mp.Barrier(3), mp.Queue()
    children = [mp.Process(target=_consume_until_empty, args=(transport.url, start, out))
                for _ in range(3)]
    for child in children:
        child.start()
    try:
        results = [out.get(timeout=30) for _ in children]
    finally:
        for child in children:
            child.join(10)
    assert [c.exitcode for c in children] == [0, 0, 0]
    seen = [i for r in results for i, _ in r]
    assert len(seen) == len(set(seen)), "a message was delivered twice"
    assert set(seen) == {f"id-{n}" for n in range(total)}
    assert {count for r in results for _, count in r} == {1}
    assert transport().queue_length(Q) == 0
