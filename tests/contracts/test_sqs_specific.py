"""What only the SQS transport does (moto's server, ``tests/services.py``): its URL forms
and options, whole-second delays and 15-minute hops, visibility kept while a message is
held and lapsing when its holder is gone, FIFO queues and their delays, the dead-letter
queue (ours and an SQS redrive policy's), kombu's body, SQS's size limits, and
broadcasts through Redis, PostgreSQL or nothing."""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest

from celeriac.errors import ConfigurationError, MessageTooLarge
from celeriac.protocol import Delivery, Message
from celeriac.settings import Settings
from celeriac.transports.base import Outgoing, Transport, create_transport
from celeriac.transports.sqs.codec import DUE
from celeriac.transports.sqs.config import parse, queue_name
from tests.loops import run, track
from tests.services import moto_endpoint, require, sqs_url

pytestmark = pytest.mark.slow  # moto's server: see SLOW_TRANSPORTS in conftest.py

Q = "specific"


def message(n: int) -> Message:
    return Message(headers={"task": "sqs.task", "id": f"id-{n}"}, body=f"b{n}".encode(),
                   properties={"priority": 0})


@pytest.fixture
def url() -> str:
    return sqs_url(f"s{uuid.uuid4().hex[:12]}")


made: list[Transport] = []


def make(url: str, **settings: Any) -> Transport:
    t = create_transport(url, Settings(broker_url=url, **settings))
    made.append(track(t))
    return t


@pytest.fixture(autouse=True)
def _close() -> Any:
    yield
    while made:
        made.pop().close()


def raw_client(t: Transport) -> Any:
    return t.sync.client  # type: ignore[attr-defined]


# -- configuration ----------------------------------------------------------------------

def test_url_forms_and_options() -> None:
    c = parse("sqs://AK%2F1:se%2Bcret@localhost:4566?is_secure=false&region=eu-west-1"
              "&queue_name_prefix=prod-&visibility_timeout=60&wait_time_seconds=5",
              Settings())
    assert (c.access_key, c.secret_key) == ("AK/1", "se+cret")
    assert c.endpoint_url == "http://localhost:4566"
    assert (c.region, c.visibility_timeout, c.wait_time_seconds) == ("eu-west-1", 60, 5)
    assert c.physical("celery") == "prod-celery"
    bare = parse("sqs://", Settings(worker_lease_timeout=7.5,
                                    result_backend="redis://h:1/2?namespace=x"))
    assert bare.access_key is None and bare.endpoint_url is None and bare.region is None
    assert bare.visibility_timeout == 8  # the worker's lease, rounded up to whole seconds
    assert bare.fanout_url == "redis://h:1/2?namespace=x"
    opts = parse("sqs://", Settings(broker_transport_options={
        "predefined_queues": {"celery": {"url": "https://sqs/123/celery"}}}))
    assert opts.predefined == {"celery": "https://sqs/123/celery"}
    # kombu's queue names: "." as "-" but the .fifo suffix, other punctuation as "_".
    assert queue_name("", "a.b:c.fifo") == "a-b_c.fifo"


@pytest.mark.parametrize(("option", "value", "says"), [
    ("visibility_timeout", "0", "visibility_timeout must be between 1 and 43200"),
    ("wait_time_seconds", "21", "wait_time_seconds must be between 0 and 20"),
    ("polling_interval", "soon", "polling_interval must be a number"),
    ("fifo_group", "random", "fifo_group must be one of queue, task, id"),
    ("is_secure", "maybe", "is_secure must be true or false"),
])
def test_bad_options_are_named(option: str, value: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        parse(f"sqs://?{option}={value}", Settings())


def test_predefined_queues_only(url: str) -> None:
    t = make(url)
    known = t.sync.url("known")  # type: ignore[attr-defined]
    only = make(url, broker_transport_options={"predefined_queues": {"known": {"url": known}}})
    only.publish("known", message(1))
    assert only.queue_length("known") == 1
    with pytest.raises(ConfigurationError, match=r"'other' is not in .*predefined_queues"):
        only.publish("other", message(2))


# -- delays -----------------------------------------------------------------------------

async def fetch_n(t: Transport, n: int, timeout: float, queue: str = Q) -> list[Delivery]:
    out: list[Delivery] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        out += await t.fetch([queue], n - len(out), deadline - time.monotonic())
    return out


def test_whole_second_delay_is_held_until_due(url: str) -> None:
    producer = make(url)

    async def scenario() -> tuple[float, list[Delivery], float, list[Delivery]]:
        c = make(url)
        await c.connect("c")
        t0 = time.monotonic()
        producer.publish(Q, message(1), delay=1.0)
        assert producer.queue_length(Q) == 0
        got = await fetch_n(c, 1, 10.0)
        waited = time.monotonic() - t0
        # A lost delivery's backoff: held, then back counted once.
        t0 = time.monotonic()
        await c.requeue(got, redelivered=True, delay=0.4)  # rounds up to 1 s
        assert await c.fetch([Q], 1, 0.0) == []
        again = await fetch_n(c, 1, 10.0)
        return waited, got, time.monotonic() - t0, again

    waited, got, backoff, again = run(scenario())
    assert [d.message for d in got] == [message(1)]
    assert waited >= 1.0 - 0.01
    assert [(d.message, d.delivery_count) for d in again] == [(message(1), 2)]
    assert backoff >= 1.0 - 0.01


def test_a_local_endpoint_in_the_url_as_kombu_writes_it() -> None:
    endpoint = urlsplit(moto_endpoint())
    t = make(f"sqs://testing:testing@{endpoint.hostname}:{endpoint.port}?is_secure=false"
             f"&namespace=h{uuid.uuid4().hex[:8]}")
    t.ping()
    t.publish(Q, message(1))
    assert t.queue_length(Q) == 1


def test_delay_past_15_minutes_goes_in_hops(url: str) -> None:
    producer = make(url)
    producer.publish(Q, message(1), delay=3600)
    sqs = raw_client(producer)
    queue_url = producer.sync.url(Q)  # type: ignore[attr-defined]
    attrs = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessagesDelayed"] == "1"  # 900 s, SQS's longest
    # A message that comes up before its due time (the first hop's end) goes back for
    # the rest, uncounted.
    due = time.time() + 1.5
    sqs.send_message(QueueUrl=queue_url, MessageBody=producer.codec.encode(  # type: ignore
        message(2), Q), MessageAttributes={DUE: {"DataType": "Number",
                                                  "StringValue": repr(due)}})

    async def scenario() -> tuple[list[Delivery], list[Delivery], float]:
        c = make(url)
        await c.connect("c")
        early = await c.fetch([Q], 10, 0.0)
        got = await fetch_n(c, 1, 10.0)
        return early, got, time.time()

    early, got, fetched_at = run(scenario())
    assert early == []
    assert [d.message for d in got] == [message(2)] and got[0].delivery_count == 1
    # Not before its due time (measured from the send: connecting can take a while on a
    # loaded machine, so a wait timed from the connection would be shorter).
    assert fetched_at >= due - 0.1


def test_fifo_queue_keeps_order_and_delays_in_its_companion(url: str) -> None:
    producer = make(url, broker_transport_options={"fifo_group": "task"})
    producer.publish("jobs.fifo", message(9), delay=1)  # FIFO queues have no such delay
    for n in range(5):
        producer.publish("jobs.fifo", message(n))
    name = producer.sync.url("jobs.fifo").rsplit("/", 1)[1]  # type: ignore[attr-defined]
    assert name.endswith("-jobs.fifo")
    assert producer.queue_length("jobs.fifo") == 5

    async def scenario() -> tuple[list[Delivery], list[Delivery], float]:
        c = make(url)
        await c.connect("c")
        t0 = time.monotonic()
        got = await fetch_n(c, 5, 5.0, "jobs.fifo")
        await c.ack(got)
        late = await fetch_n(c, 1, 10.0, "jobs.fifo")  # moved over once due
        await c.ack(late)
        # A delayed requeue (a retry's backoff) goes the same way.
        producer.publish("jobs.fifo", message(10))
        [d] = await fetch_n(c, 1, 5.0, "jobs.fifo")
        await c.requeue([d], redelivered=True, delay=1)
        again = await fetch_n(c, 1, 10.0, "jobs.fifo")
        await c.ack(again)
        return got, late + again, time.monotonic() - t0

    got, later, _ = run(scenario())
    assert [d.message.headers["id"] for d in got] == [f"id-{n}" for n in range(5)]
    assert [(d.message, d.delivery_count) for d in later] == [(message(9), 1), (message(10), 2)]
    assert producer.purge("jobs.fifo") == 0

# -- visibility -------------------------------------------------------------------------

@pytest.mark.slow  # waits out a visibility timeout
def test_held_message_stays_invisible_then_returns_when_its_holder_is_gone(url: str) -> None:
    make(url).publish(Q, message(1))
    opts = {"broker_transport_options": {"visibility_timeout": "1"}}

    async def scenario() -> list[Delivery]:
        holder, other = make(url, **opts), make(url, **opts)
        await holder.connect("holder")
        await other.connect("other")
        [_held] = await holder.fetch([Q], 1, 2.0)
        # Held 2.5 visibility timeouts with no renew_lease call: the holder's loop
        # extends what it holds by itself.
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            assert await other.fetch([Q], 1, 0.2) == []
        await holder.release()  # as a crash: nothing given back
        return await fetch_n(other, 1, 10.0)

    [again] = run(scenario())
    assert again.message == message(1)
    assert again.delivery_count == 2


# -- dead letters -----------------------------------------------------------------------

def test_dead_letters_requeue_and_purge(url: str) -> None:
    producer = make(url)
    producer.publish_many([])
    for n in range(3):
        producer.publish(Q, message(n))

    async def kill_all() -> None:
        c = make(url)
        await c.connect("c")
        for d in await fetch_n(c, 3, 5.0):
            await c.dead_letter(d, f"bad {d.message.headers['id']}")

    run(kill_all())
    dead = producer.dead_letters()
    assert [(d.queue, d.reason, d.message) for d in dead] == [
        (Q, f"bad id-{n}", message(n)) for n in range(3)]
    assert producer.dead_letters(limit=1)[0].id == dead[0].id  # listing leaves them there
    assert producer.requeue_dead([dead[1].id, "no-such-id"]) == 1
    assert producer.queue_length(Q) == 1
    assert producer.purge_dead([dead[0].id]) == 1
    assert [d.id for d in producer.dead_letters()] == [dead[2].id]
    assert producer.purge_dead() == 1
    assert producer.dead_letters() == []


def test_a_redrive_policy_dead_letter_is_listed(url: str) -> None:
    producer = make(url)
    sqs = raw_client(producer)
    dlq = producer.sync.url("celeriac-dead")  # type: ignore[attr-defined]
    sqs.send_message(QueueUrl=dlq, MessageBody=producer.codec.encode(  # type: ignore
        message(7), Q))
    [letter] = producer.dead_letters()
    assert letter.reason == "redrive policy" and letter.message == message(7)
    assert producer.requeue_dead([letter.id]) == 0  # its queue is unknown: left there


# -- kombu's layout ---------------------------------------------------------------------

def test_kombu_layout_body_is_base64_of_kombus_envelope(url: str) -> None:
    kombu = make(f"{url}&layout=kombu")
    kombu.publish("celery", message(1))
    sqs = raw_client(kombu)
    queue_url = kombu.sync.url("celery")  # type: ignore[attr-defined]
    [raw] = sqs.receive_message(QueueUrl=queue_url)["Messages"]
    env = orjson.loads(base64.b64decode(raw["Body"]))
    assert env["headers"] == message(1).headers
    assert base64.b64decode(env["body"]) == b"b1"
    assert env["properties"]["delivery_info"] == {"exchange": "", "routing_key": "celery"}
    sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=raw["ReceiptHandle"])
    # A JSON body without base64 (kombu reads those too), as another producer sends.
    sqs.send_message(QueueUrl=queue_url, MessageBody=orjson.dumps(env).decode())

    async def scenario() -> list[Delivery]:
        c = make(f"{url}&layout=kombu")
        await c.connect("c")
        return await fetch_n(c, 1, 5.0, "celery")

    [d] = run(scenario())
    assert d.message.headers == message(1).headers and d.message.body == b"b1"
    # The queues it creates keep Celery's workers' tasks kombu's 30 minutes (ours extend
    # their own; a visibility_timeout given is used instead, as kombu does).
    attrs = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["VisibilityTimeout"])
    assert attrs["Attributes"]["VisibilityTimeout"] == "1800"
    mine = make(f"{url}&visibility_timeout=45")
    mine_url = mine.sync.url("other")  # type: ignore[attr-defined]
    attrs = sqs.get_queue_attributes(QueueUrl=mine_url, AttributeNames=["VisibilityTimeout"])
    assert attrs["Attributes"]["VisibilityTimeout"] == "45"


# -- broadcasts -------------------------------------------------------------------------

def test_without_a_fanout_store_broadcasts_are_dropped_with_one_warning(
        url: str, caplog: pytest.LogCaptureFixture) -> None:
    t = make(url)
    caplog.set_level(logging.WARNING, "celeriac.transports.sqs")
    t.broadcast("celeriac.events", b"x")
    t.broadcast("celeriac.events", b"y")
    assert not t.has_subscribers("celeriac.events")

    async def scenario() -> bytes | None:
        sub = await t.subscribe("celeriac.control")
        try:
            return await sub.get(0.05)
        finally:
            await sub.close()

    assert run(scenario()) is None
    assert sum("SQS has no fanout" in r.getMessage() for r in caplog.records) == 1


def test_broadcast_goes_through_the_result_backends_redis(url: str) -> None:
    backend = f"{require('redis')}?namespace=b{uuid.uuid4().hex[:8]}"
    a, b = make(url, result_backend=backend), make(url, result_backend=backend)

    async def scenario() -> bytes | None:
        sub = await a.subscribe("celeriac.events")
        try:
            assert b.has_subscribers("celeriac.events")
            await asyncio.to_thread(b.broadcast, "celeriac.events", b"hello")
            return await sub.get(5.0)
        finally:
            await sub.close()

    assert run(scenario()) == b"hello"


def test_a_message_over_sqs_size_limit_is_refused_and_nothing_published(url: str) -> None:
    producer = make(url)
    small = message(1)
    big = Message(headers={"task": "sqs.task", "id": "big"}, body=b"x" * 800_000,
                  properties={"priority": 0})  # 1.07 MB in base64: over SQS's 1 MiB
    with pytest.raises(MessageTooLarge, match="over SQS's 1048576"):
        producer.publish_many([Outgoing(Q, small), Outgoing(Q, big)])
    assert producer.queue_length(Q) == 0
    # Batches hold at most 1 MiB: three 400 kB messages go in more than one.
    mid = [Message(headers={"task": "sqs.task", "id": f"m{n}"}, body=b"y" * 300_000,
                   properties={"priority": 0}) for n in range(3)]
    producer.publish_many([Outgoing(Q, m) for m in mid])
    assert producer.queue_length(Q) == 3


def test_broadcast_goes_through_the_result_backends_postgresql(url: str) -> None:
    backend = f"{require('postgres')}?namespace=b{uuid.uuid4().hex[:8]}"
    a, b = make(url, result_backend=backend), make(url, result_backend=backend)
    big = bytes(range(256)) * 100  # 25.6 kB: several NOTIFY parts

    async def scenario() -> list[bytes | None]:
        sub = await a.subscribe("celeriac.events")
        try:
            for payload in (b"hello", big, b""):
                await asyncio.to_thread(b.broadcast, "celeriac.events", payload)
            return [await sub.get(5.0) for _ in range(3)] + [await sub.get(0.05)]
        finally:
            await sub.close()

    assert run(scenario()) == [b"hello", big, b"", None]
