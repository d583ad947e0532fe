"""The compatibility layout's broadcast channels on Celery's exchanges
(``compat/channels.py``, ``compat/events.py``, ``compat/pidbox.py``):
which exchange, routing key, headers and body each channel becomes, with a fake broker.
The real ones (Celery's CLI, Flower) are in ``tests/compat/test_monitoring.py``."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Mapping
from typing import Any

import orjson

from celeriac.compat import events as celery_wire
from celeriac.compat import kombu_wire as kw
from celeriac.compat import pidbox
from celeriac.compat.channels import CeleryChannels, KombuExchanges
from celeriac.compat.kombu_wire import Exchange
from celeriac.control.mailbox import CONTROL_CHANNEL, decode_command, encode_command
from celeriac.events.dispatcher import EVENTS_CHANNEL, routing_key
from celeriac.transports.base import PRIVATE_PREFIX, Subscription


class FakeSub(Subscription):
    def __init__(self, payloads: list[bytes]) -> None:
        self.payloads = payloads
        self.closed = False

    async def get(self, timeout: float) -> bytes | None:
        return self.payloads.pop(0) if self.payloads else None

    async def close(self) -> None:
        self.closed = True


class FakeExchanges(KombuExchanges):
    def __init__(self) -> None:
        self.sent: list[tuple[Exchange, str, bytes, dict[str, Any]]] = []
        self.opened: list[tuple[str, Exchange, str, str | None]] = []
        self.incoming: list[bytes] = []

    def publish(self, exchange: Exchange, routing_key: str, body: bytes,
                headers: Mapping[str, Any]) -> None:
        self.sent.append((exchange, routing_key, body, dict(headers)))

    async def subscribe(self, exchange: Exchange, binding_key: str) -> Subscription:
        self.opened.append(("subscribe", exchange, binding_key, None))
        return FakeSub(list(self.incoming))

    async def consume(self, exchange: Exchange, routing_key: str, queue: str
                      ) -> Subscription:
        self.opened.append(("consume", exchange, routing_key, queue))
        return FakeSub(list(self.incoming))


def test_event_batches_go_to_celeryev_as_celery_frames_them() -> None:
    fake = FakeExchanges()
    channels = CeleryChannels(fake)
    one = orjson.dumps([{"type": "worker-heartbeat", "freq": 2.0}])
    many = orjson.dumps([{"type": "task-received"}, {"type": "task-started"}])
    assert channels.broadcast(EVENTS_CHANNEL, one, routing_key("worker-heartbeat", 1))
    assert channels.broadcast(EVENTS_CHANNEL, many, routing_key("task-received", 2))
    (ex1, key1, body1, _), (ex2, key2, body2, _) = fake.sent
    assert ex1 == ex2 == Exchange("celeryev", "topic", durable=True)
    # One event: the object under its own key; several: Celery 4's array, <group>.multi.
    assert key1 == "worker.heartbeat" and orjson.loads(body1) == {"type": "worker-heartbeat",
                                                                  "freq": 2.0}
    assert key2 == "task.multi" and orjson.loads(body2) == orjson.loads(many)


def test_received_events_become_arrays_for_our_receiver() -> None:
    assert celery_wire.incoming(b'{"type": "worker-online"}') == b'[{"type": "worker-online"}]'
    assert celery_wire.incoming(b'[{"type": "task-sent"}]') == b'[{"type": "task-sent"}]'
    fake = FakeExchanges()
    fake.incoming = [b'{"type":"worker-heartbeat"}']
    sub = asyncio.run(_first(CeleryChannels(fake), EVENTS_CHANNEL))
    assert sub == b'[{"type":"worker-heartbeat"}]'
    assert fake.opened == [("subscribe", celery_wire.EXCHANGE, "#", None)]


async def _first(channels: CeleryChannels, channel: str) -> bytes | None:
    sub = await channels.subscribe(channel)
    assert sub is not None
    try:
        return await sub.get(0.1)
    finally:
        await sub.close()


def test_commands_and_replies_use_the_pidbox() -> None:
    fake = FakeExchanges()
    channels = CeleryChannels(fake)
    url = "redis://127.0.0.1:6379/3?layout=kombu"
    payload = encode_command("ping", ticket="t1", reply=True,
                             reply_exchange=pidbox.reply_exchange_for(url))
    assert decode_command(payload).reply_to == {"exchange": "reply.celery.pidbox",
                                                "routing_key": "t1"}
    assert pidbox.reply_exchange_for("redis://127.0.0.1:6379/3") == "celeriac.reply"
    channels.broadcast(CONTROL_CHANNEL, payload, "ping")
    # A reply to a Celery caller: routed by its key (kombu's oid), the ticket in a header.
    channels.broadcast(PRIVATE_PREFIX + "oid-1", b'{"w@h": {"ok": "pong"}}', "t1")
    (cmd_ex, cmd_key, cmd_body, cmd_headers), (rep_ex, rep_key, _, rep_headers) = fake.sent
    assert cmd_ex == Exchange("celery.pidbox", "fanout", durable=False)
    assert cmd_key == "" and cmd_body == payload
    assert cmd_headers == {"clock": 0, "expires": 0}
    assert rep_ex == Exchange("reply.celery.pidbox", "direct", durable=False)
    assert rep_key == "oid-1" and rep_headers == {"ticket": "t1", "clock": 0}
    asyncio.run(_first(channels, CONTROL_CHANNEL))
    asyncio.run(_first(channels, PRIVATE_PREFIX + "t2"))
    assert fake.opened == [("subscribe", pidbox.EXCHANGE, "", None),
                           ("consume", pidbox.REPLY_EXCHANGE, "t2",
                            "t2.reply.celery.pidbox")]


def test_other_channels_are_left_to_the_transport() -> None:
    channels = CeleryChannels(FakeExchanges())
    assert channels.broadcast("celeriac.other", b"x") is False
    assert asyncio.run(channels.subscribe("celeriac.other")) is None


def test_broadcast_envelope_is_kombus() -> None:
    raw = kw.broadcast_envelope(b'{"a": 1}', {"ticket": "t"}, "reply.celery.pidbox", "k")
    env = orjson.loads(raw)
    assert base64.b64decode(env["body"]) == b'{"a": 1}'
    assert env["content-type"] == "application/json" and env["headers"] == {"ticket": "t"}
    props = env["properties"]
    assert props["body_encoding"] == "base64" and props["delivery_tag"]
    assert props["delivery_info"] == {"exchange": "reply.celery.pidbox", "routing_key": "k"}
    assert kw.broadcast_body(raw) == b'{"a": 1}'
    assert kw.broadcast_body(b"not json") is None
    assert kw.broadcast_body(b'{"properties": {}, "body": "plain"}') == b"plain"


def test_mingle_takes_a_celery_workers_revoked_ids() -> None:
    from types import SimpleNamespace

    from celeriac import Celeriac
    from celeriac.worker.mingle import Mingle
    from celeriac.worker.revoked import Revoked

    app = Celeriac("mingle-test", broker="memory://")
    worker = SimpleNamespace(hostname="me@h", revoked=Revoked(), events=None, app=app)
    # Celery 5.7 answers hello with the ids only; celeriac with {id: expires at}.
    Mingle(worker).merge([{"celery@h": {"revoked": ["a", "b"], "clock": 3}},  # type: ignore[arg-type]
                          {"celeriac@h": {"revoked": {"c": 9e12}, "clock": 4}}], 0.01)
    assert {"a", "b", "c"} <= set(worker.revoked.ids)


def test_kombu_options_and_exchange_names_other_than_celerys_are_refused() -> None:
    import pytest

    from celeriac import Celeriac
    from celeriac.compat.redis_pubsub import check_options, database
    from celeriac.errors import ConfigurationError

    check_options({"fanout_prefix": True, "visibility_timeout": 10,
                   "global_keyprefix": "app:"})  # kombu's prefix is spoken (test_keyprefix)
    for bad in ({"fanout_prefix": False}, {"fanout_patterns": False}):
        with pytest.raises(ConfigurationError, match=next(iter(bad))):
            check_options(bad)
    assert database("redis://h:6379/7?layout=kombu") == 7
    assert database("redis://h:6379?db=3") == 3 and database("redis://h") == 0
    Celeriac("ok", control_exchange="celery", event_exchange="celeryev")
    with pytest.raises(ConfigurationError, match="control_exchange"):
        Celeriac("bad", control_exchange="other")
