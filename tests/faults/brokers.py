"""The integration ``env`` pointed at a network broker: each test gets its own namespace
on the shared Redis or RabbitMQ (results on Redis), and what it made is deleted after.

A test module opts in with ``from tests.faults.brokers import env`` (the name overrides the
SQLite ``env`` of tests/integration/conftest.py for that module only).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pika
import pytest

from tests.contracts.conftest import _drop_amqp_namespace, _drop_redis_namespace
from tests.services import require

AMQP_NAMES = ("celery", "other", "celeriac.dead", "celeriac.events")


@contextlib.contextmanager
def broker_env(kind: str, base: dict[str, str]) -> Iterator[dict[str, str]]:
    """``base`` with a new namespace on the shared Redis or RabbitMQ (``kind``: "redis",
    "amqp"), results on Redis; what was made there is deleted on exit."""
    ns = f"f{uuid.uuid4().hex[:12]}"
    results = f"{require('redis')}?namespace={ns}"
    broker = results if kind == "redis" else f"{require('rabbitmq')}?namespace={ns}"
    yield {**base, "CELERIAC_BROKER_URL": broker, "CELERIAC_RESULT_BACKEND": results}
    _drop_redis_namespace(results)
    if kind == "amqp":
        _drop_amqp_namespace(broker, AMQP_NAMES, AMQP_NAMES[:2])


@pytest.fixture(params=["redis", "amqp"])
def env(request: pytest.FixtureRequest, env: dict[str, str]) -> Iterator[dict[str, str]]:
    with broker_env(request.param, env) as e:
        yield e


def pika_parameters() -> pika.URLParameters:
    # pika reads the vhost from the path: "//" would be the empty vhost, not "/".
    return pika.URLParameters(require("rabbitmq").rstrip("/") + "/%2F")
