"""The kombu-layout Redis transport (``?layout=kombu``) on a real Redis, without Celery:
the keys kombu reads, the unacked hash and its visibility-timeout restore, re-stamping
under a live worker, give-back, delays and dead letters. Redis database 10."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import orjson
import pytest
import redis

from celeriac import Settings
from celeriac.compat.redis_broker import KombuRedisTransport
from celeriac.protocol import Message, task_headers, task_properties
from celeriac.transports import create_transport
from tests.services import require

DB = 10
URL = f"redis://127.0.0.1:6379/{DB}?layout=kombu"


@pytest.fixture
def admin() -> Iterator[redis.Redis]:
    require("redis")
    client = redis.Redis(db=DB)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def transport(**options: object) -> KombuRedisTransport:
    url = URL + "".join(f"&{k}={v}" for k, v in options.items())
    t = create_transport(url, Settings(broker_url=url))
    assert isinstance(t, KombuRedisTransport)
    return t


def message(task_id: str, priority: int = 0) -> Message:
    headers = task_headers(task="compat.add", task_id=task_id, args_repr="()",
                           kwargs_repr="{}")
    return Message(headers, b'[[1, 2], {}, {}]', properties=task_properties(task_id, priority))


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_publish_writes_kombus_layout(admin: redis.Redis) -> None:
    t = transport()
    t.publish("q", message("a"))
    t.publish("q", message("b", priority=7))
    assert admin.smembers("_kombu.binding.q") == {b"q\x06\x16\x06\x16q"}
    assert admin.llen("q") == 1 and admin.llen("q\x06\x166") == 1
    env = orjson.loads(admin.lindex("q", 0) or b"")
    assert env["properties"]["body_encoding"] == "base64"
    assert env["properties"]["delivery_info"] == {"exchange": "", "routing_key": "q"}
    assert env["headers"]["id"] == "a" and env["content-type"] == "application/json"
    assert t.queue_length("q") == 2
    t.close()


def test_fetch_records_unacked_and_ack_clears_it(admin: redis.Redis) -> None:
    t = transport()
    t.publish("q", message("low", priority=9))
    t.publish("q", message("high", priority=0))

    async def go() -> list[str]:
        await t.connect("c1")
        got = await t.fetch(["q"], 10, 1.0)
        assert admin.hlen("unacked") == 2 and admin.zcard("unacked_index") == 2
        await t.ack(got)
        assert admin.hlen("unacked") == 0 and admin.zcard("unacked_index") == 0
        await t.release()
        return [d.message.headers["id"] for d in got]

    # kombu's Redis order: priority 0 first.
    assert run(go()) == ["high", "low"]
    t.close()


def test_visibility_timeout_restores_a_dead_workers_message(admin: redis.Redis) -> None:
    dead, live = transport(visibility_timeout=1), transport(visibility_timeout=1)
    dead.publish("q", message("m"))

    async def go() -> None:
        await dead.connect("dead")
        [_lost] = await dead.fetch(["q"], 10, 1.0)
        await dead.release()  # dies holding it
        await live.connect("live")
        assert await live.renew_lease() == 0  # not yet timed out
        await asyncio.sleep(1.2)  # sleep-ok: time passes for the visibility timeout
        assert await live.renew_lease() == 1
        [again] = await live.fetch(["q"], 10, 1.0)
        assert again.message.headers["id"] == "m" and again.delivery_count == 2
        assert again.message.headers["redelivered"] is True
        await live.ack([again])
        await live.release()

    run(go())
    assert admin.hlen("unacked") == 0
    dead.close()
    live.close()


@pytest.mark.slow  # waits out real visibility timeouts
def test_a_live_worker_re_stamps_what_it_holds(admin: redis.Redis) -> None:
    t, other = transport(visibility_timeout=1), transport(visibility_timeout=1)
    t.publish("q", message("long"))

    async def go() -> None:
        await t.connect("runner")
        [held] = await t.fetch(["q"], 10, 1.0)
        await other.connect("other")
        for _ in range(4):  # 2 s of a long task, renewing as the consumer does
            await asyncio.sleep(0.5)  # sleep-ok: time passes for the visibility timeout
            await t.renew_lease()
            assert await other.renew_lease() == 0
        await t.ack([held])
        await t.release()
        await other.release()

    run(go())
    assert admin.llen("q") == 0
    t.close()
    other.close()


def test_give_back_delay_and_dead_letter(admin: redis.Redis) -> None:
    t = transport()
    t.publish("q", message("back"))
    t.publish("q", message("dead"))

    async def go() -> None:
        await t.connect("c")
        got = {d.message.headers["id"]: d for d in await t.fetch(["q"], 10, 1.0)}
        await t.requeue([got["back"]], redelivered=False)
        await t.dead_letter(got["dead"], "bad input")
        [back] = await t.fetch(["q"], 10, 1.0)
        assert back.delivery_count == 1
        start = time.monotonic()
        await t.requeue([back], redelivered=True, delay=0.3)
        assert await t.fetch(["q"], 10, 0.05) == []
        [later] = await t.fetch(["q"], 10, 2.0)
        assert time.monotonic() - start >= 0.29 and later.delivery_count == 2
        await t.ack([later])
        await t.release()

    run(go())
    [dead] = t.dead_letters()
    assert dead.reason == "bad input" and dead.message.headers["id"] == "dead"
    assert t.requeue_dead([dead.id]) == 1 and t.queue_length("q") == 1
    assert t.purge("q") == 1 and t.purge_dead() == 0
    t.close()


def test_parking_a_foreign_eta_uses_the_delay_store(admin: redis.Redis) -> None:
    t = transport()

    async def go() -> None:
        await t.connect("c")
        t.publish("q", message("eta"), delay=0.3)  # as the consumer parks a message
        assert admin.zcard("_celeriac.kombu.delayed") == 1 and admin.llen("q") == 0
        [due] = await t.fetch(["q"], 10, 2.0)
        await t.ack([due])
        await t.release()

    run(go())
    t.close()


def test_url_options_are_checked(admin: redis.Redis) -> None:
    from celeriac.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="visibility_timeout"):
        transport(visibility_timeout="soon")
    with pytest.raises(ConfigurationError, match="namespace"):
        transport(namespace="x")
    with pytest.raises(ConfigurationError, match="layout='celery' is not a broker layout"):
        create_transport("redis://127.0.0.1/0?layout=celery", Settings())
