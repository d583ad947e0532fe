"""Fanout groups at the transport level (no worker processes): two consumers bound to
one group each fetch their own copy of a fanout publish, on Redis and RabbitMQ; a
consumer that disconnects gets no more copies; on Redis a binding whose consumer stops
renewing lapses with its lease."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from celeriac.protocol import Message, new_id, task_headers, task_properties
from celeriac.settings import Settings
from celeriac.transports.base import Outgoing, Transport, create_transport
from tests.contracts.conftest import _drop_amqp_namespace, _drop_redis_namespace
from tests.loops import run, track
from tests.services import require


def message() -> Message:
    task_id = new_id()
    return Message(task_headers(task="t.fan", task_id=task_id, args_repr="()", kwargs_repr="{}"),
                   b"[[], {}, {}]",
                   "application/json", "utf-8", task_properties(task_id, 0))


@pytest.fixture(params=["redis", "rabbitmq"])
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    ns = f"fo{uuid.uuid4().hex[:10]}"
    if request.param == "redis":
        url = f"{require('redis')}?namespace={ns}"
        yield url
        _drop_redis_namespace(url)
    else:
        url = f"{require('rabbitmq')}?namespace={ns}."
        yield url
        _drop_amqp_namespace(url, ("grp", "grp.c1", "grp.c2"), ())


def test_each_bound_consumer_fetches_its_own_copy(url: str) -> None:
    settings = Settings(broker_url=url, worker_lease_timeout=0.5)

    async def scenario() -> None:
        producer = create_transport(url, settings)
        one, two = (track(create_transport(url, settings)) for _ in range(2))
        try:
            await one.connect("c1")
            await two.connect("c2")
            await one.bind_fanout("grp", "grp.c1")
            await two.bind_fanout("grp", "grp.c2")
            first = message()
            producer.publish_many([Outgoing("grp", first, fanout=True)])
            got = [await fetched(t, q) for t, q in ((one, "grp.c1"), (two, "grp.c2"))]
            assert [d.message.headers["id"] for d in got] == [first.headers["id"]] * 2
            await one.ack([got[0]])
            await two.ack([got[1]])
            await two.disconnect()  # unbound (Redis), its queue deleted (RabbitMQ)
            second = message()
            producer.publish_many([Outgoing("grp", second, fanout=True)])
            assert (await fetched(one, "grp.c1")).message.headers["id"] == second.headers["id"]
            if "redis" in url:
                assert producer.queue_length("grp.c2") == 0
        finally:
            producer.close()

    run(scenario())


def test_a_redis_binding_lapses_with_its_consumers_lease() -> None:
    url = f"{require('redis')}?namespace=fl{uuid.uuid4().hex[:10]}"
    settings = Settings(broker_url=url, worker_lease_timeout=0.2)

    async def scenario() -> None:
        producer = create_transport(url, settings)
        silent = track(create_transport(url, settings))
        try:
            await silent.connect("c1")
            await silent.bind_fanout("grp", "grp.c1")
            producer.publish_many([Outgoing("grp", message(), fanout=True)])
            assert producer.queue_length("grp.c1") == 1
            await asyncio.sleep(0.8)  # sleep-ok: past 3 x the lease, unrenewed
            producer.publish_many([Outgoing("grp", message(), fanout=True)])
            assert producer.queue_length("grp.c1") == 1  # no copy for a lapsed binding
        finally:
            producer.close()

    try:
        run(scenario())
    finally:
        _drop_redis_namespace(url)


async def fetched(transport: Transport, queue: str) -> object:
    got = await transport.fetch([queue], 10, 5.0)
    assert len(got) == 1, got
    return got[0]
