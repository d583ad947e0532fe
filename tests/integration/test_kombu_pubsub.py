"""kombu's exchanges on a real Redis (``compat/redis_pubsub.py``), through a
kombu-layout transport's broadcast channels: the keys and channels Celery's clients use,
and nothing left behind by a call. Redis database 13 is this module's."""

from __future__ import annotations

import asyncio
import base64

import orjson
import pytest
import redis

from celeriac import Settings
from celeriac.compat.redis_broker import KombuRedisTransport
from celeriac.control.mailbox import CONTROL_CHANNEL
from celeriac.events.dispatcher import EVENTS_CHANNEL
from celeriac.transports.base import PRIVATE_PREFIX, create_transport
from tests.services import require

DB = 4
URL = f"redis://127.0.0.1:6379/{DB}?layout=kombu"


@pytest.fixture
def transport() -> KombuRedisTransport:
    require("redis")
    redis.Redis(db=DB).flushdb()
    t = create_transport(URL, Settings(broker_url=URL))
    assert isinstance(t, KombuRedisTransport)
    return t


def test_a_reply_queue_is_kombus_and_leaves_nothing(transport: KombuRedisTransport) -> None:
    r = redis.Redis(db=DB)

    async def call() -> bytes | None:
        sub = await transport.subscribe(PRIVATE_PREFIX + "tick1")
        try:
            # Bound as kombu binds a reply queue: a worker of either kind finds it.
            assert r.smembers("_kombu.binding.reply.celery.pidbox") == {
                b"tick1\x06\x16\x06\x16tick1.reply.celery.pidbox"}
            assert r.zscore("_kombu.binding_deadlines", "reply.celery.pidbox")
            await asyncio.to_thread(transport.broadcast, PRIVATE_PREFIX + "tick1",
                                    b'{"w@h": {"ok": "pong"}}', "T")
            return await sub.get(2.0)
        finally:
            await sub.close()
            await transport.release()

    assert asyncio.run(call()) == b'{"w@h": {"ok": "pong"}}'
    assert not r.exists("tick1.reply.celery.pidbox", "_kombu.binding.reply.celery.pidbox")
    # Nobody bound: a reply is dropped, as kombu's direct exchange would route it nowhere.
    transport.broadcast(PRIVATE_PREFIX + "gone", b"{}", "T")
    assert not r.exists("gone.reply.celery.pidbox")
    transport.close()


def test_events_and_commands_go_on_kombus_channels(transport: KombuRedisTransport) -> None:
    async def capture() -> tuple[bytes | None, list[dict[str, object]]]:
        events = await transport.subscribe(EVENTS_CHANNEL)
        commands = await transport.subscribe(CONTROL_CHANNEL)
        listener = redis.asyncio.Redis(db=DB)
        pubsub = listener.pubsub()
        await pubsub.psubscribe(f"/{DB}.celeryev/*")  # as Celery's EventReceiver does
        try:
            await asyncio.to_thread(transport.broadcast, CONTROL_CHANNEL, b'{"method":"ping"}',
                                    "ping")
            await asyncio.to_thread(transport.broadcast, EVENTS_CHANNEL,
                                    b'[{"type":"worker-heartbeat"}]', "worker.heartbeat")
            command = await commands.get(2.0)
            seen = [await events.get(2.0)]
            raw = []
            for _ in range(20):  # bounded: the subscribe confirmation, then the message
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
                if msg is not None:
                    raw.append(msg)
                    break
            return command, [orjson.loads(s) for s in seen if s] + [
                {"channel": m["channel"].decode(),
                 "body": orjson.loads(base64.b64decode(orjson.loads(m["data"])["body"]))}
                for m in raw]
        finally:
            await events.close()
            await commands.close()
            await pubsub.aclose()
            await listener.aclose()
            await transport.release()

    command, seen = asyncio.run(capture())
    assert command == b'{"method":"ping"}'
    assert seen == [[{"type": "worker-heartbeat"}],
                    {"channel": f"/{DB}.celeryev/worker.heartbeat",
                     "body": {"type": "worker-heartbeat"}}]
    transport.close()
