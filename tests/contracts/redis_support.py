"""Fixtures and helpers of the Redis-specific test modules: a namespace of the test's own
on the shared Redis (its keys deleted after), transports made in it, message helpers."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from celeriac.protocol import Delivery, Message
from celeriac.settings import Settings
from celeriac.transports.redis import RedisTransport
from tests.loops import forget, track
from tests.services import require


def message(n: int, *, priority: int = 0) -> Message:
    return Message(headers={"task": "t", "id": f"id-{n}"}, body=f"b{n}".encode(),
                   properties={"priority": priority})


def ids(deliveries: list[Delivery]) -> list[str]:
    return [d.message.headers["id"] for d in deliveries]


@pytest.fixture
def ns() -> Iterator[str]:
    require("redis")
    name = f"r{uuid.uuid4().hex[:12]}"
    yield name
    admin = redis.Redis()
    keys = list(admin.scan_iter(match=f"{name}*", count=1000))
    if keys:
        admin.delete(*keys)
    admin.close()


@pytest.fixture
def url(ns: str) -> str:
    return f"{require('redis')}?namespace={ns}"


@pytest.fixture
def make(url: str) -> Iterator[Callable[..., RedisTransport]]:
    """Transports in the test's namespace; ``broker_url=`` for several URLs (failover)."""
    made: list[RedisTransport] = []

    def factory(broker_url: str | None = None, **settings: Any) -> RedisTransport:
        full = broker_url or url
        t = RedisTransport(full.split(";")[0], Settings(broker_url=full, **settings))
        made.append(track(t))
        return t

    yield factory
    forget()
    for t in made:
        t.close()
