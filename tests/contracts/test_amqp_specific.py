"""What only the RabbitMQ transport promises: Celery's wire format, quorum queues,
delivery counts across lost connections, reconnection, failover, dead-letter admin,
broadcast, and the producer's error on a dead broker.

Each test uses its own ``namespace`` on the shared RabbitMQ and deletes what it declared.
"""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pika
import pytest
from pamqp import commands as spec

from celeriac.errors import BrokerUnavailable, EncodeError, OperationalError
from celeriac.protocol import Delivery, Message, task_headers, task_properties, validate_headers
from celeriac.settings import Settings
from celeriac.testing import wait_until
from celeriac.transports.amqp import AMQPTransport, wire
from celeriac.transports.base import Outgoing, create_transport
from tests.compat.conftest import celery_venv  # noqa: F401  (a fixture: Celery, made on first use)
from tests.loops import forget, run, track
from tests.services import require

T = TypeVar("T")
mp = multiprocessing.get_context("fork")


class Broker:
    """Transports on one namespace of the shared RabbitMQ; removes it all afterwards."""

    def __init__(self) -> None:
        self.base = require("rabbitmq")
        self.ns = f"s{uuid.uuid4().hex[:12]}"
        self.url = f"{self.base}?namespace={self.ns}"
        self.made: list[AMQPTransport] = []

    def __call__(self, url: str | None = None, **settings: Any) -> AMQPTransport:
        url = url or self.url
        t = create_transport(url, Settings(broker_url=url, **settings))
        assert isinstance(t, AMQPTransport)
        self.made.append(track(t))
        return t

    def raw(self) -> Any:
        """A pika channel, to look at what is on the wire."""
        conn = pika.BlockingConnection(pika.URLParameters(self.base.rstrip("/") + "/%2F"))
        return conn.channel()

    def cleanup(self) -> None:
        forget()
        for t in self.made:
            t.close()
        ch = self.raw()
        for name in self.queues:
            ch.queue_delete(name)
            ch.exchange_delete(name)
        ch.connection.close()

    @property
    def queues(self) -> list[str]:
        """Every queue and exchange name a test here may have made (delete is idempotent)."""
        names = [f"{self.ns}{q}" for q in ("q", "a", "celeriac.dead", "events")]
        return names + [f"{self.ns}celeriac.delay.q.{k}" for k in range(wire.DELAY_LEVELS)]


@pytest.fixture
def broker() -> Iterator[Broker]:
    b = Broker()
    yield b
    b.cleanup()


def message(n: int, **headers: Any) -> Message:
    return Message({"task": "t.task", "id": f"id-{n}", **headers}, f"body-{n}".encode(),
                   properties={"priority": 0})


async def consumer(broker: Broker, name: str, **settings: Any) -> AMQPTransport:
    t = broker(**settings)
    await t.connect(name)
    return t


async def fetch_n(t: AMQPTransport, n: int, timeout: float = 3.0) -> list[Delivery]:
    out: list[Delivery] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        out += await t.fetch(["q"], n - len(out), deadline - time.monotonic())
    return out


async def die(t: AMQPTransport) -> None:
    """The consumer's connection ends without giving anything back (a lost worker)."""
    assert t._link is not None
    await t._link.conn.close()


def drop_tcp(t: AMQPTransport) -> None:
    """The TCP connection breaks (no AMQP goodbye): abort the socket aiormq writes to."""
    assert t._link is not None
    frame = t._link.conn._writer_task.get_coro().cr_frame  # type: ignore[attr-defined]
    frame.f_locals["writer"].transport.abort()


def task_message(task_id: str) -> Message:
    headers = task_headers(task="proj.add", task_id=task_id, args_repr="(2, 3)",
                           kwargs_repr="{}", time_limit=30.5, soft_time_limit=None)
    body = json.dumps([[2, 3], {}, {"callbacks": None, "errbacks": None, "chain": None,
                                    "chord": None}]).encode()
    return Message(headers, body, "application/json", "utf-8", task_properties(task_id, 7))


# -- the wire format ----------------------------------------------------------------------

def test_task_message_on_the_wire_is_celery_protocol_v2(broker: Broker) -> None:
    sent = task_message("6b6f5b1e-0000-4000-8000-000000000001")
    broker().publish("q", sent)
    ch = broker.raw()
    method, props, body = ch.basic_get(f"{broker.ns}q", auto_ack=True)
    ch.connection.close()
    assert method.exchange == "" and method.routing_key == f"{broker.ns}q"
    assert body == sent.body
    assert props.content_type == "application/json" and props.content_encoding == "utf-8"
    assert props.correlation_id == sent.headers["id"]
    assert props.priority == 7 and props.delivery_mode == 2 and props.reply_to is None
    # pika's decoder truncates doubles to ints (the reason dead letters are read through
    # aiormq), so the float is compared apart; Celery's own client reads it exactly below.
    headers = dict(props.headers)
    assert headers.pop("timelimit") == [30, None]
    assert headers == {k: v for k, v in sent.headers.items() if k != "timelimit"}


def test_headers_table_is_encoded_as_py_amqp_does() -> None:
    raw = wire.encode_properties({"headers": {"f": 0.1, "i": 7, "big": 2 ** 40, "n": None,
                                              "b": True, "s": "ü", "l": [1, [2.5]],
                                              "d": {"x": b"\x00"}},
                                  "content_type": "application/json", "priority": 3})
    props = spec.Basic.Properties()
    flags = int.from_bytes(raw[:2], "big")
    props.unmarshal(flags, raw[2:])
    assert props.headers == {"f": 0.1, "i": 7, "big": 2 ** 40, "n": None, "b": True, "s": "ü",
                             "l": [1, [2.5]], "d": {"x": b"\x00"}}
    assert props.content_type == "application/json" and props.priority == 3
    assert b"d" + (0.1).hex().encode() not in raw  # floats are 64-bit 'd', not 32-bit 'f'
    with pytest.raises(EncodeError):
        wire.encode_properties({"headers": {"x": object()}})


def test_a_header_that_cannot_go_out_publishes_nothing(broker: Broker) -> None:
    producer = broker()
    with pytest.raises(EncodeError):
        producer.publish_many([Outgoing("q", message(1)),
                               Outgoing("q", message(2, bad={1, 2}))])
    assert producer.queue_length("q") == 0


def test_floats_survive_requeue_and_dead_letters(broker: Broker) -> None:
    broker().publish("q", message(1, limit=[0.1, 2.5]))

    async def scenario() -> None:
        c = await consumer(broker, "c")
        [d] = await fetch_n(c, 1)
        await c.requeue([d], redelivered=True)
        [d] = await fetch_n(c, 1)
        assert d.message.headers["limit"] == [0.1, 2.5] and d.delivery_count == 2
        await c.dead_letter(d, "bad")
        await c.disconnect()

    run(scenario())
    [dead] = broker().dead_letters()
    assert dead.message == message(1, limit=[0.1, 2.5]) and dead.delivery_count == 2
    assert abs(dead.dead_at - time.time()) < 60


def test_message_without_headers_is_still_delivered(broker: Broker) -> None:
    producer = broker()
    producer.queue_length("q")
    ch = broker.raw()
    ch.queue_declare(f"{broker.ns}q", durable=True, arguments={"x-max-priority": 10})
    ch.basic_publish("", f"{broker.ns}q", b"\xff not json")
    ch.connection.close()

    async def scenario() -> Delivery:
        c = await consumer(broker, "c")
        [d] = await fetch_n(c, 1)
        return d

    d = run(scenario())
    assert d.message.headers == {} and d.message.body == b"\xff not json"
    assert validate_headers(d.message.headers) is not None  # the worker dead-letters it


def test_queue_declared_otherwise_is_used_as_it_is(broker: Broker,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    ch = broker.raw()
    ch.queue_declare(f"{broker.ns}q", durable=True)  # as a plain Celery setup would
    ch.connection.close()
    producer = broker()
    producer.publish("q", message(1))

    async def scenario() -> list[Delivery]:
        return await fetch_n(await consumer(broker, "c"), 1)

    assert [d.message for d in run(scenario())] == [message(1)]
    assert "exists with other arguments" in caplog.text


# -- Celery itself (its virtualenv made on first use, as the compat tests make it) -------

def _celery(venv: Path, script: str, url: str) -> str:
    done = subprocess.run([str(venv / "bin" / "python"), "-c", script, url],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


CELERY_SEND = """
import sys
from celery import Celery
from kombu import Queue
app = Celery("producer", broker=sys.argv[1])
q = Queue(sys.argv[2], queue_arguments={"x-max-priority": 10})
r = app.send_task("proj.add", args=(2, 3), kwargs={"z": 1.5}, queue=q, priority=5,
                  time_limit=12.5)
print(r.id)
"""

CELERY_READ = """
import json, sys
from kombu import Connection
with Connection(sys.argv[1]) as conn:
    m = conn.default_channel.basic_get(sys.argv[2], no_ack=True)
    p = m.properties
    body = m.body.encode(p["content_encoding"]) if isinstance(m.body, str) else m.body
    print(json.dumps({"headers": m.headers, "body": body.hex(),
                      "content_type": p.get("content_type"),
                      "content_encoding": p.get("content_encoding"),
                      "correlation_id": p.get("correlation_id"),
                      "priority": p.get("priority"), "delivery_mode": p.get("delivery_mode")}))
"""


def test_a_celery_producers_task_is_consumed(broker: Broker, celery_venv: Path) -> None:  # noqa: F811
    task_id = _celery(celery_venv, CELERY_SEND.replace("sys.argv[2]", repr(f"{broker.ns}q")),
                      broker.base).strip()

    async def scenario() -> Delivery:
        [d] = await fetch_n(await consumer(broker, "c"), 1)
        return d

    d = run(scenario())
    h = d.message.headers
    assert validate_headers(h) is None
    assert (h["task"], h["id"], h["timelimit"]) == ("proj.add", task_id, [12.5, None])
    assert d.message.properties["correlation_id"] == task_id
    assert d.message.priority == 5 and d.message.content_type == "application/json"
    args, kwargs, _embed = json.loads(d.message.body)
    assert (args, kwargs) == ([2, 3], {"z": 1.5})


def test_celery_reads_our_task_message_as_sent(broker: Broker, celery_venv: Path) -> None:  # noqa: F811
    sent = task_message("6b6f5b1e-0000-4000-8000-000000000002")
    broker().publish("q", sent)
    got = json.loads(_celery(celery_venv, CELERY_READ.replace("sys.argv[2]", repr(f"{broker.ns}q")),
                             broker.base))
    assert got["headers"] == sent.headers
    assert bytes.fromhex(got["body"]) == sent.body
    assert (got["content_type"], got["content_encoding"]) == ("application/json", "utf-8")
    assert (got["correlation_id"], got["priority"], got["delivery_mode"]) == (
        sent.headers["id"], 7, 2)


# -- delivery counts ----------------------------------------------------------------------

def test_each_lost_connection_counts_one_delivery_on_classic_queues(broker: Broker) -> None:
    broker().publish("q", message(1))

    async def scenario() -> list[int]:
        counts = []
        for n in range(3):
            c = await consumer(broker, f"c{n}")
            [d] = await fetch_n(c, 1)
            counts.append(d.delivery_count)
            await die(c)  # redelivered flag: the next one publishes it again, counted
        return counts

    assert run(scenario()) == [1, 2, 3]


def test_quorum_queues_count_with_x_delivery_count(broker: Broker) -> None:
    opts: dict[str, Any] = {"broker_transport_options": {"queue_type": "quorum"}}
    producer = broker(**opts)
    producer.publish("q", message(1))
    producer.publish("q", message(2), delay=0.2)
    ch = broker.raw()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="x-queue-type"):
        ch.queue_declare(f"{broker.ns}q", durable=True)  # it is a quorum queue
    ch.connection.close()

    async def scenario() -> list[tuple[str, int]]:
        a = await consumer(broker, "a", **opts)
        [d] = await fetch_n(a, 1)
        assert d.delivery_count == 1
        await die(a)
        b = await consumer(broker, "b", **opts)
        got = await fetch_n(b, 2)
        await b.requeue(got[:1], redelivered=False)
        got[:1] = await fetch_n(b, 1)
        await b.ack(got)
        await b.disconnect()
        return sorted((d.message.headers["id"], d.delivery_count) for d in got)

    assert run(scenario()) == [("id-1", 2), ("id-2", 1)]
    assert producer.queue_length("q") == 0


# -- connections --------------------------------------------------------------------------

def test_after_a_lost_connection_fetch_reconnects_and_old_acks_are_ignored(
        broker: Broker) -> None:
    producer = broker()
    producer.publish("q", message(1))

    async def scenario() -> None:
        c = await consumer(broker, "c")
        [old] = await fetch_n(c, 1)
        assert c._link is not None
        drop_tcp(c)
        with pytest.raises(BrokerUnavailable):
            while True:
                await c.fetch(["q"], 1, 1.0)
        [new] = await fetch_n(c, 1)  # reconnected; the broker delivers it again
        assert new.message == old.message and new.delivery_count == 2
        await c.ack([old])  # stale: ignored, no error, and it must not ack `new`
        assert producer.queue_length("q") == 0
        await c.requeue([new], redelivered=False)
        [again] = await fetch_n(c, 1)
        assert again.delivery_count == 2
        await c.ack([again])
        await c.disconnect()

    run(scenario())
    assert producer.queue_length("q") == 0


def test_producer_on_a_dead_port_raises_operational_error_with_the_password_masked() -> None:
    url = "amqp://guest:s3cret@127.0.0.1:1//"
    t = create_transport(url, Settings(broker_url=url, broker_connection_max_retries=2))
    began = time.monotonic()
    with pytest.raises(OperationalError) as info:
        t.publish("q", message(1))
    text = str(info.value)
    assert "127.0.0.1:1" in text and "***" in text and "s3cret" not in text
    assert time.monotonic() - began < 10
    with pytest.raises(BrokerUnavailable):
        t.ping()


def test_failover_to_the_next_url(broker: Broker) -> None:
    urls = f"amqp://guest:guest@127.0.0.1:1//?namespace={broker.ns};{broker.base}"
    first = urls.split(";")[0]
    producer = create_transport(first, Settings(broker_url=urls))
    producer.publish("q", message(1))

    async def scenario() -> list[Delivery]:
        c = create_transport(first, Settings(broker_url=urls))
        await c.connect("c")
        assert isinstance(c, AMQPTransport)
        got = await fetch_n(c, 1)
        await c.disconnect()
        c.close()
        return got

    assert [d.message for d in run(scenario())] == [message(1)]
    producer.close()


def _publish_in_child(url: str) -> None:
    create_transport(url, Settings(broker_url=url)).publish("q", message(2))


def test_forked_child_uses_a_connection_of_its_own(broker: Broker) -> None:
    producer = broker()
    producer.publish("q", message(1))
    child = mp.Process(target=_publish_in_child, args=(broker.url,))
    child.start()
    child.join(20)
    assert child.exitcode == 0
    producer.publish("q", message(3))  # the parent's connection is intact
    child = mp.Process(target=producer.publish, args=("q", message(4)))  # inherited one
    child.start()
    child.join(20)
    assert child.exitcode == 0
    producer.publish("q", message(5))
    assert producer.queue_length("q") == 5


def test_publish_many_confirms_a_batch(broker: Broker) -> None:
    producer = broker()
    producer.publish_many([Outgoing("q", message(n)) for n in range(2000)])
    assert producer.queue_length("q") == 2000


# -- delays, purge, dead letters, broadcast -----------------------------------------------

def test_delay_routes_through_its_binary_levels() -> None:
    assert wire.delay_route(0) is None
    assert wire.delay_route(0.0004) == (0, ".".join("0" * (wire.DELAY_LEVELS - 1) + "1"))
    top, bits = wire.delay_route(0.3) or (0, "")
    assert top == 8 and int(bits.replace(".", ""), 2) == 300
    top, _ = wire.delay_route(10 ** 9) or (0, "")
    assert top == wire.DELAY_LEVELS - 1  # capped; the worker parks it again by its eta


def test_purge_reaches_long_delays(broker: Broker) -> None:
    producer = broker()
    producer.publish("q", message(1), delay=3600)
    producer.publish("q", message(2), delay=0.05)
    producer.publish("q", message(3))
    wait_until(lambda: producer.queue_length("q") == 2, 5, message="the short delay came due")
    assert producer.purge("q") == 3
    assert producer.purge("q") == 0


def test_dead_letters_are_listed_requeued_and_purged(broker: Broker) -> None:
    producer = broker()
    for n in range(4):
        producer.publish("q", message(n))

    async def scenario() -> None:
        c = await consumer(broker, "c")
        got = await fetch_n(c, 4)
        await c.requeue(got[:1], redelivered=True)  # counted: dead with 2 deliveries
        got[:1] = await fetch_n(c, 1)
        for d in got:
            await c.dead_letter(d, f"reason {d.message.headers['id']}")
        await c.disconnect()

    run(scenario())
    listed = producer.dead_letters()
    assert producer.dead_letters() == listed  # listing takes nothing
    assert [(d.queue, d.reason, d.delivery_count) for d in listed] == [
        ("q", "reason id-0", 2), ("q", "reason id-1", 1), ("q", "reason id-2", 1),
        ("q", "reason id-3", 1)]
    assert producer.requeue_dead([listed[0].id, "no-such-id"]) == 1
    assert producer.purge_dead([listed[1].id]) == 1
    assert [d.id for d in producer.dead_letters()] == [listed[2].id, listed[3].id]

    async def back() -> list[Delivery]:
        return await fetch_n(await consumer(broker, "d"), 1)

    [d] = run(back())
    assert d.message == message(0) and d.delivery_count == 1  # count reset
    assert producer.purge_dead() == 2
    assert producer.dead_letters() == []


def test_broadcast_reaches_every_current_subscriber_in_order(broker: Broker) -> None:
    producer = broker()

    async def scenario() -> tuple[list[bytes | None], list[bytes | None], bytes | None]:
        c = await consumer(broker, "c")
        one, two = await c.subscribe("events"), await c.subscribe("events")
        for n in range(3):
            producer.broadcast("events", f"p{n}".encode())
        got_one = [await one.get(1.0) for _ in range(3)]
        got_two = [await two.get(1.0) for _ in range(3)]
        late = await c.subscribe("events")
        nothing = await late.get(0.1)
        for s in (one, two, late):
            await s.close()
        await c.disconnect()
        return got_one, got_two, nothing

    one, two, late = run(scenario())
    assert one == two == [b"p0", b"p1", b"p2"]
    assert late is None


def test_worker_connection_heartbeat_follows_the_lease(broker: Broker) -> None:
    assert broker(worker_lease_timeout=10.0).config.heartbeat == 5
    assert broker(worker_lease_timeout=0.3).config.heartbeat == 1
    assert broker(broker_transport_options={"heartbeat": "30"}).config.heartbeat == 30


def test_namespace_is_not_sent_to_the_broker(broker: Broker) -> None:
    t = broker()
    assert t.config.namespace == broker.ns
    assert all("namespace" not in u for u in t.config.urls)
    assert wire.vhost(t.config.urls[0]) == "/"  # amqp://host// is vhost "/", as in kombu
