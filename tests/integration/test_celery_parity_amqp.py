"""``apply_async(app_id=)`` on RabbitMQ: the AMQP ``app_id`` property goes out on the wire,
as kombu sends it, and comes back in the message a worker reads (the task's
``request.properties``). Its own namespace on the shared RabbitMQ, deleted afterwards."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pytest

from celeriac import Celeriac
from celeriac.protocol import Delivery
from celeriac.transports.amqp import AMQPTransport, wire
from tests.loops import forget, run, track
from tests.services import require


@pytest.fixture
def amqp_app() -> Iterator[tuple[Celeriac, Any, str]]:
    base = require("rabbitmq")
    ns = f"p{uuid.uuid4().hex[:12]}"
    app = Celeriac("parity", broker=f"{base}?namespace={ns}", backend="memory://")

    @app.task(name="parity.echo")
    def echo(x: Any) -> Any:
        return x

    yield app, echo, ns
    forget()
    app.close()
    conn = pika.BlockingConnection(pika.URLParameters(base.rstrip("/") + "/%2F"))
    ch = conn.channel()
    for name in [f"{ns}{q}" for q in ("celery", "celeriac.dead")] + [
            f"{ns}celeriac.delay.celery.{k}" for k in range(wire.DELAY_LEVELS)]:
        ch.queue_delete(name)
        ch.exchange_delete(name)
    conn.close()


def test_app_id_goes_out_and_comes_back(amqp_app: tuple[Celeriac, Any, str]) -> None:
    app, echo, _ = amqp_app
    res = echo.apply_async((1,), app_id="billing")
    echo.apply_async((2,))  # none asked: none sent

    async def fetch_two() -> list[Delivery]:
        t = track(app.transport)
        assert isinstance(t, AMQPTransport)
        await t.connect("probe")
        got: list[Delivery] = []
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            got += await t.fetch(["celery"], 2 - len(got), deadline - time.monotonic())
        return got

    first, second = sorted(run(fetch_two()), key=lambda d: d.message.headers["id"] != res.id)
    assert first.message.headers["id"] == res.id
    assert first.message.properties["app_id"] == "billing"
    assert "app_id" not in second.message.properties
