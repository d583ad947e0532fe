"""The order a fair queue hands messages out in (Redis broker, ``publish.lua``'s fair
tags), on a namespace of the shared Redis, no worker: a key that comes later alternates
with one that came first from where the consumers are; priority still comes first; a
message given back keeps its place; a queue not declared fair is FIFO as ever."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from celeriac import Settings
from celeriac.protocol import Message
from celeriac.transports.base import Transport, create_transport
from tests.contracts.conftest import _drop_redis_namespace
from tests.loops import run, track
from tests.services import require


@pytest.fixture
def url() -> Iterator[str]:
    url = f"{require('redis')}?namespace=ffo{uuid.uuid4().hex[:10]}"
    yield url
    _drop_redis_namespace(url)


def transport(url: str) -> Transport:
    return track(create_transport(url, Settings(broker_url=url,
                                                broker_fair_queues=("fair",))))


def msg(key: str | None, n: int, priority: int = 0) -> Message:
    headers = {"task": "t", "id": f"{key}{n}", **({"celeriac_fair": key} if key else {})}
    return Message(headers=headers, body=b"[]", properties={"priority": priority})


def order(url: str, queue: str, n: int, give_back: int = 0) -> list[str]:
    async def go() -> list[str]:
        c = transport(url)
        await c.connect("reader")
        got = await c.fetch([queue], give_back, 1.0) if give_back else []
        if got:
            await c.requeue(got, redelivered=False)
        out = [d.message.headers["id"] for d in await c.fetch([queue], n, 1.0)]
        await c.disconnect()
        c.close()
        return out

    return run(go())


def test_a_later_key_alternates_with_the_first_from_the_head(url: str) -> None:
    p = transport(url)
    for i in range(1, 6):
        p.publish("fair", msg("a", i))
    for i in range(1, 3):
        p.publish("fair", msg("b", i))
    p.publish("fair", msg("c", 1, priority=9))  # the highest priority: first, fair or not
    # a1 heads the queue (tag 1): b's tags start after it and interleave with a's;
    # equal tags go in publish order.
    assert order(url, "fair", 8, give_back=2) == ["c1", "a1", "a2", "b1", "a3", "b2",
                                                  "a4", "a5"]
    p.close()


def test_without_a_key_on_a_fair_queue_is_the_key_nobody_named(url: str) -> None:
    p = transport(url)
    for i in range(1, 4):
        p.publish("fair", msg(None, i))
    p.publish("fair", msg("x", 1))
    assert order(url, "fair", 4) == ["None1", "None2", "x1", "None3"]
    for i in range(1, 4):
        p.publish("plain", msg("x", i))
    p.publish("plain", msg("y", 1))
    assert order(url, "plain", 4) == ["x1", "x2", "x3", "y1"]  # not fair: FIFO
    p.close()
