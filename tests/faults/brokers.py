"""The integration ``env`` pointed at a network broker: each test gets its own namespace
on the shared Redis or RabbitMQ (results on Redis), and what it made is deleted after.

A test module opts in with ``from tests.faults.brokers import env`` (the name overrides the
SQLite ``env`` of tests/integration/conftest.py for that module only).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pika
import pytest
import redis

from tests.services import require

AMQP_NAMES = ("celery", "other", "celeriac.dead", "celeriac.events")


@pytest.fixture(params=["redis", "amqp"])
def env(request: pytest.FixtureRequest, env: dict[str, str]) -> Iterator[dict[str, str]]:
    ns = f"f{uuid.uuid4().hex[:12]}"
    results = f"{require('redis')}?namespace={ns}"
    broker = results if request.param == "redis" else f"{require('rabbitmq')}?namespace={ns}"
    yield {**env, "CELERIAC_BROKER_URL": broker, "CELERIAC_RESULT_BACKEND": results}
    drop_redis(ns)
    if request.param == "amqp":
        drop_amqp(ns)


def drop_redis(ns: str) -> None:
    client = redis.Redis.from_url(require("redis"))
    try:
        keys = list(client.scan_iter(match=f"{ns}:*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start:start + 500])
    finally:
        client.close()


def drop_amqp(ns: str) -> None:
    from celeriac.transports.amqp import wire as amqp_wire

    conn = pika.BlockingConnection(pika_parameters())
    try:
        ch = conn.channel()
        for name in AMQP_NAMES:
            ch.queue_delete(f"{ns}{name}")
            ch.exchange_delete(f"{ns}{name}")
        for name in AMQP_NAMES[:2]:  # the task queues, the only ones with delays
            for k in range(amqp_wire.DELAY_LEVELS):
                ch.queue_delete(f"{ns}celeriac.delay.{name}.{k}")
                ch.exchange_delete(f"{ns}celeriac.delay.{name}.{k}")
    finally:
        conn.close()


def amqp_channel() -> pika.adapters.blocking_connection.BlockingChannel:
    """A raw pika channel on the shared RabbitMQ (the caller closes its connection)."""
    return pika.BlockingConnection(pika_parameters()).channel()


def pika_parameters() -> pika.URLParameters:
    # pika reads the vhost from the path: "//" would be the empty vhost, not "/".
    return pika.URLParameters(require("rabbitmq").rstrip("/") + "/%2F")
