"""Celery and celeriac on one RabbitMQ (``amqp://...?layout=kombu``): queues declared as
Celery 5 declares them, so whichever side declares a queue first, the other's declaration
is accepted (no PRECONDITION_FAILED on ``x-max-priority``); tasks both ways, results in
Celery's Redis layout read by the other side, a chain from each side.

Queue names are this module's own (a suffix per run) on the default virtual host;
results in Redis database 7."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pytest
import redis

from celeriac import Celeriac, chain, signature
from tests.services import require

pytestmark = pytest.mark.slow

DB = 7
SUFFIX = uuid.uuid4().hex[:8]
TO_CELERY, TO_CELERIAC = f"compat_to_celery_{SUFFIX}", f"compat_to_celeriac_{SUFFIX}"


@pytest.fixture(scope="module")
def urls() -> Iterator[tuple[str, str]]:
    amqp = require("rabbitmq")
    require("redis")
    redis.Redis(db=DB).flushdb()
    yield amqp, f"redis://127.0.0.1:6379/{DB}"
    # The default virtual host ("//" in the URL, which pika reads as "").
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1"))
    channel = connection.channel()
    for name in (TO_CELERY, TO_CELERIAC):
        channel.queue_delete(name)
        channel.exchange_delete(name)
    connection.close()


@pytest.fixture(scope="module")
def app(urls: tuple[str, str]) -> Iterator[Celeriac]:
    amqp, results = urls
    app = Celeriac("compat-amqp", broker=f"{amqp}?layout=kombu",
                   backend=f"{results}?layout=celery")
    yield app
    app.close()


@pytest.fixture(scope="module")
def fleet(fleet_factory: Any, app: Celeriac, urls: tuple[str, str]) -> Any:
    amqp, results = urls
    theirs = {"COMPAT_BROKER": amqp, "COMPAT_BACKEND": results}
    ours = {"COMPAT_BROKER": f"{amqp}?layout=kombu",
            "COMPAT_BACKEND": f"{results}?layout=celery"}
    # Each side declares a queue first, then the other side's worker declares it too.
    fleet_factory.early = app.send_task("compat.who", ["declared by celeriac"],
                                        queue=TO_CELERY)
    fleet_factory.celery = fleet_factory.client(theirs)
    fleet_factory.theirs_early = fleet_factory.celery.run(
        f"out = proj.who.apply_async(('declared by celery',), queue={TO_CELERIAC!r}).id")
    fleet_factory.celery_worker(theirs, "amqp-celery", TO_CELERY)
    fleet_factory.celeriac_worker(ours, "amqp-celeriac", TO_CELERIAC, "-c", "1")
    return fleet_factory


def test_queues_declared_first_by_either_side(app: Celeriac, fleet: Any) -> None:
    assert fleet.early.get(timeout=20) == ["celery", "declared by celeriac"]
    assert app.AsyncResult(fleet.theirs_early).get(timeout=20) == \
        ["celeriac", "declared by celery"]


def test_both_directions_with_results(app: Celeriac, fleet: Any) -> None:
    assert app.send_task("compat.add", [2, 3], queue=TO_CELERY).get(timeout=20) == 5
    out = fleet.celery.run(f"out = proj.add.apply_async((4, 5), queue={TO_CELERIAC!r})"
                           ".get(timeout=20)")
    assert out == 9
    with pytest.raises(ValueError, match="nope"):
        app.send_task("compat.boom", ["nope"], queue=TO_CELERY).get(timeout=20)


def test_chain_from_each_side(app: Celeriac, fleet: Any) -> None:
    c = chain(signature("compat.add", (1, 1), app=app).set(queue=TO_CELERY),
              signature("compat.mul", (5,), app=app).set(queue=TO_CELERIAC),
              signature("compat.add", (1,), app=app).set(queue=TO_CELERY))
    assert c.apply_async().get(timeout=30) == 11
    out = fleet.celery.run(
        f"out = chain(proj.add.s(2, 2).set(queue={TO_CELERIAC!r}), "
        f"proj.mul.s(3).set(queue={TO_CELERY!r}), proj.add.s(1).set(queue={TO_CELERIAC!r}))"
        ".apply_async().get(timeout=30)")
    assert out == 13
