"""Remote control over every transport: a command reaches a worker, its reply comes
back on the call's own channel, and the call leaves nothing behind in the broker (no
reply queue, exchange, key or row); the revoked-id store works where the broker (or,
on RabbitMQ, the result backend) has one."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl

import pytest

from celeriac import Celeriac
from celeriac.control.mailbox import CONTROL_CHANNEL, REPLY_PREFIX
from celeriac.control.store import store_for
from celeriac.testing import ThreadedWorker
from tests.contracts.conftest import (
    TransportFactory,
    _drop_amqp_namespace,
    _drop_redis_namespace,
    _namespace,
)
from tests.services import require

AMQP_NAMES = ("celery", "celeriac.dead", "celeriac.events", "celeriac.control",
              "celeriac.reply")


@pytest.fixture
def control_app(transport: TransportFactory) -> Iterator[Celeriac]:
    results = f"memory://{uuid.uuid4().hex}"
    if transport.name == "amqp":  # the revoked store lives in the result backend there
        results = f"{require('redis')}?namespace=r{uuid.uuid4().hex[:12]}"
    app = Celeriac("contract", broker=transport.url, result_backend=results,
                   set_as_current=False, worker_lease_timeout=2.0)
    yield app
    app.close()
    if transport.name == "amqp":
        _drop_amqp_namespace(transport.url, AMQP_NAMES, ())
        _drop_redis_namespace(results)


def _leftovers(name: str, app: Celeriac) -> Any:
    """What the broker holds that a control call could have left: compared before and
    after the calls."""
    url = app.settings.broker_url
    if name == "memory":
        return set(app.transport.broker.subscribers)  # type: ignore[attr-defined]
    if name == "sqlite":
        return app.transport.db.read(  # type: ignore[attr-defined]
            "SELECT count(*) FROM broadcasts WHERE channel LIKE ?", (REPLY_PREFIX + "%",))
    if name == "redis":
        import redis

        client = redis.Redis.from_url(url.partition("?")[0])
        ns = _namespace(url)
        try:
            keys = {k for k in client.scan_iter(match=f"{ns}:*") if b":revoked" not in k}
            replies = app.transport.conn.endpoint.channel(REPLY_PREFIX)  # type: ignore[attr-defined]
            channels = set(client.pubsub_channels(replies + "*"))
            return keys, channels
        finally:
            client.close()
    if name == "redis-kombu":
        import redis

        query = dict(parse_qsl(url.partition("?")[2]))
        prefix = query["global_keyprefix"]
        client = redis.Redis.from_url(url.partition("?")[0])
        try:
            # Not counted: the revoked ids, and kombu's deadline of the reply exchange's
            # binding set (one entry per exchange, not per call; kombu sweeps it).
            keys = {k for k in client.scan_iter(match=f"{prefix}*")
                    if b"revoked" not in k and not k.endswith(b"_kombu.binding_deadlines")}
            return keys, set(client.pubsub_channels(f"{prefix}*"))
        finally:
            client.close()
    ns = _namespace(url)
    out = subprocess.run(["rabbitmqctl", "-q", "list_bindings", "source_name",
                          "destination_name"], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    return sorted(line for line in out.splitlines() if line.startswith(ns + "celeriac.reply"))


def test_broadcast_and_reply_leave_nothing_behind(transport: TransportFactory,
                                                  control_app: Celeriac) -> None:
    app = control_app
    with ThreadedWorker(app, hostname="c1@contract", mingle=False) as w:
        # Gossip subscribes to the events when it starts, after the consumer's first
        # turn: before this test's calls or during them. Its channel is not a leftover.
        before = _leftovers(transport.name, app)
        if transport.name == "memory":
            gossip = {"celeriac.events"}
            before -= gossip
            assert before == {CONTROL_CHANNEL}
        start = time.monotonic()
        assert app.control.ping(destination=["c1@contract"], timeout=5) == [
            {"c1@contract": {"ok": "pong"}}]
        assert time.monotonic() - start < 2  # limit (the destination) ended it early
        got = app.control.inspect(timeout=5, limit=1).stats()
        assert got is not None and got["c1@contract"]["pool"]["implementation"] == "solo"
        assert app.control.broadcast("nope", reply=True, limit=1, timeout=5) == [
            {"c1@contract": {"error": "unknown command 'nope'"}}]
        # Without reply: sent, answered by nobody, nothing to clean.
        app.control.broadcast("heartbeat")
        # The revoked-id store: a revoke is recorded with its expiry, and the version
        # moves so a worker reloads it.
        store = store_for(app)
        assert store is not None
        version, _ = store.load_if_changed(object())
        app.control.revoke(["r-1", "r-2"], reply=True, limit=1, timeout=5)
        new_version, ids = store.load_if_changed(version)
        assert ids is not None and {"r-1", "r-2"} <= set(ids)
        assert min(ids.values()) > time.time() + 3600
        assert store.load_if_changed(new_version) == (new_version, None)
        store.close()
        assert {"r-1", "r-2"} <= set(w.worker.revoked.ids)
        after = _leftovers(transport.name, app)
        assert (after - gossip if transport.name == "memory" else after) == before
