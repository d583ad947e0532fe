"""The Redis transport's compact layout (lua/common.lua, ``protocol.pack``): a message is
one string with its default headers left out, restored on reading; messages of the
earlier layout (a hash with the full JSON envelope) are still read, counted, dead-lettered
and requeued; a queued message's size stays bounded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest
import redis

from celeriac.errors import DecodeError
from celeriac.protocol import Message, pack, task_headers, task_properties, unpack
from celeriac.transports.base import Outgoing
from celeriac.transports.redis import RedisTransport
from tests.contracts import redis_support
from tests.loops import run

ns, url, make = redis_support.ns, redis_support.url, redis_support.make

Q = "compact"
TASK_ID = "6f1c2a9e-63c4-4d0e-9a52-7d1be0f1d3a4"
EMPTY_BODY = b'[[],{},{"callbacks":null,"errbacks":null,"chain":null,"chord":null}]'


def producer_message(task_id: str = TASK_ID, **headers: Any) -> Message:
    """A message as ``producer/builder.py`` makes one for ``noop.delay()``."""
    h = task_headers(task="bench.noop", task_id=task_id, args_repr="()", kwargs_repr="{}")
    h.update(headers)
    return Message(h, EMPTY_BODY, "application/json", "utf-8", task_properties(task_id, 0))


ODD = [
    producer_message(),
    producer_message(retries=False, ignore_result=0, root_id="other", lang="go",
                     timelimit=[1.5, None], argsrepr="(1,)", eta="2030-01-01T00:00:00+00:00"),
    Message({"task": "t", "id": "x"}, b"", "application/json", "utf-8", {}),
    Message({"task": "t", "id": 5, "root_id": 5}, b"\x80\x04.", "application/x-python-serialize",
            "binary", {"correlation_id": 5, "priority": 7, "app_id": "a"}),
    Message({"task": "t", "id": "y", "shadow": "s", "x-extra": {"k": [1, None]}}, EMPTY_BODY,
            "application/x-msgpack", "utf-8", {"reply_to": "q", "delivery_mode": 1}),
]


@pytest.mark.parametrize("message", ODD)
def test_a_packed_message_comes_back_key_for_key(message: Message) -> None:
    envelope, body = pack(message)
    got = unpack(envelope, body)
    assert got == message
    assert set(got.headers) == set(message.headers)
    assert set(got.properties) == set(message.properties)


def test_defaults_are_left_out_and_the_old_envelope_is_still_read() -> None:
    m = producer_message()
    envelope, body = pack(m)
    assert body == b"" and len(envelope) < 120
    assert set(orjson.loads(envelope)[0]) == {"task", "id", "origin"}
    assert unpack(m.envelope(), m.body) == m
    assert Message.from_packed(*m.packed()) == m


@pytest.mark.parametrize("bad", [b"[", b"[1, 2]", b"[{}]", b"[{}, {}, 3]"])
def test_a_broken_compact_envelope_is_a_decode_error(bad: bytes) -> None:
    with pytest.raises(DecodeError, match="malformed message envelope"):
        unpack(bad, b"")


def test_a_queued_message_is_one_small_string(make: Callable[..., RedisTransport],
                                              ns: str) -> None:
    make().publish(Q, producer_message())
    admin = redis.Redis()
    try:
        [key] = admin.keys(f"{ns}:m:*")
        assert admin.type(key) == b"string"
        assert admin.memory_usage(key) <= 256  # the hash of every header took 896
        assert not admin.exists(f"{ns}:counts")  # no counter until a hand-out
    finally:
        admin.close()


def write_old_form(ns: str, message: Message, queue: str = Q) -> str:
    """A message as the previous version stored it (a hash with the full envelope)."""
    admin = redis.Redis()
    try:
        mid = f"{admin.incr(f'{ns}:seq'):016d}"
        admin.hset(f"{ns}:m:{mid}", mapping={"q": queue, "s": 9, "e": message.envelope(),
                                             "b": message.body})
        admin.zadd(f"{ns}:q:{queue}", {mid: 9})
        return mid
    finally:
        admin.close()


def test_old_form_messages_are_read_counted_and_acked(make: Callable[..., RedisTransport],
                                                      ns: str) -> None:
    old = producer_message("old-1")
    write_old_form(ns, old)
    new = producer_message("new-1")
    t = make()
    t.publish(Q, new)

    async def scenario() -> None:
        c = make()
        await c.connect("c1")
        got = await c.fetch([Q], 10, 1.0)
        assert [d.message for d in got] == [old, new]
        assert [d.delivery_count for d in got] == [1, 1]
        await c.requeue(got, redelivered=True)
        again = await c.fetch([Q], 10, 1.0)
        assert [d.delivery_count for d in again] == [2, 2]
        await c.requeue(again, redelivered=False)  # given back unstarted: not counted
        third = await c.fetch([Q], 10, 1.0)
        assert [d.delivery_count for d in third] == [2, 2]
        await c.ack(third)
        await c.disconnect()

    run(scenario())
    admin = redis.Redis()
    try:
        assert admin.keys(f"{ns}:m:*") == [] and not admin.exists(f"{ns}:counts")
    finally:
        admin.close()


@pytest.mark.parametrize("form", ["old", "new"])
def test_dead_letters_of_either_form_list_requeue_and_purge(
        make: Callable[..., RedisTransport], ns: str, form: str) -> None:
    t = make()
    msgs = [producer_message(f"{form}-{n}") for n in range(2)]
    for m in msgs:
        write_old_form(ns, m) if form == "old" else t.publish(Q, m)

    async def scenario() -> None:
        c = make()
        await c.connect("c1")
        got = await c.fetch([Q], 10, 1.0)
        await c.requeue(got, redelivered=True)
        got = await c.fetch([Q], 10, 1.0)
        for d in got:
            await c.dead_letter(d, f"reason {d.message.headers['id']}")
        await c.disconnect()

    run(scenario())
    dead = t.dead_letters()
    assert [d.message for d in dead] == msgs
    assert [(d.reason, d.delivery_count) for d in dead] == [(f"reason {form}-0", 2),
                                                         (f"reason {form}-1", 2)]
    assert t.requeue_dead([dead[0].id]) == 1 and t.purge_dead([dead[1].id]) == 1

    async def back() -> None:
        c = make()
        await c.connect("c2")
        [d] = await c.fetch([Q], 10, 1.0)
        assert d.message == msgs[0] and d.delivery_count == 1
        await c.ack([d])
        await c.disconnect()

    run(back())
    admin = redis.Redis()
    try:
        assert admin.keys(f"{ns}:m:*") == [] and not admin.exists(f"{ns}:counts")
    finally:
        admin.close()


def test_odd_queue_names_priorities_and_purge(make: Callable[..., RedisTransport],
                                              ns: str) -> None:
    t = make()
    queue = "a,1,2,b\x00é" + "q" * 200  # commas, a NUL, UTF-8, longer than a head read
    msgs = [Message({"task": "t", "id": f"p{p}"}, b"x" * p, properties={"priority": p})
            for p in (0, 9, 5)]
    t.publish_many([Outgoing(queue, m) for m in msgs])
    t.publish(queue, producer_message("later"), delay=30)

    async def scenario() -> None:
        c = make()
        await c.connect("c1")
        got = await c.fetch([queue], 2, 1.0)
        assert [(d.queue, d.message) for d in got] == [(queue, msgs[1]), (queue, msgs[2])]
        await c.disconnect()  # back to the queue, uncounted (read_head on a long name)

    run(scenario())
    assert t.queue_length(queue) == 3
    assert t.purge(queue) == 4  # three ready, one delayed
    admin = redis.Redis()
    try:
        assert admin.keys(f"{ns}:m:*") == [] and not admin.exists(f"{ns}:counts")
    finally:
        admin.close()


def test_compact_messages_off_publishes_the_earlier_layout(
        make: Callable[..., RedisTransport], ns: str) -> None:
    """For an upgrade: workers of the previous version read only the hash form."""
    legacy = make(broker_transport_options={"compact_messages": "false"})
    m = producer_message("legacy-1")
    legacy.publish(Q, m)
    admin = redis.Redis()
    try:
        [key] = admin.keys(f"{ns}:m:*")
        assert admin.type(key) == b"hash"
        assert admin.hget(key, "e") == m.envelope()  # what the previous version decodes
    finally:
        admin.close()

    async def scenario() -> None:
        c = make()
        await c.connect("c1")
        [d] = await c.fetch([Q], 1, 1.0)
        assert d.message == m and d.delivery_count == 1
        await c.ack([d])
        await c.disconnect()

    run(scenario())
