"""``rpc://`` between Celery and celeriac on one RabbitMQ: a Celery client's result comes
back from a celeriac worker to its reply queue, and a celeriac client's from a Celery
worker (Celery's RPC backend's wire: ``reply_to``, ``correlation_id``, the meta as the
body). Queue names are this module's own (a suffix per run) on the default virtual host;
reply queues are auto-delete, gone with their client's connection."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pytest

from celeriac import Celeriac, chain, signature
from tests.services import require

pytestmark = pytest.mark.slow

SUFFIX = uuid.uuid4().hex[:8]
TO_CELERY, TO_CELERIAC = f"compat_rpc_celery_{SUFFIX}", f"compat_rpc_celeriac_{SUFFIX}"


@pytest.fixture(scope="module")
def amqp() -> Iterator[str]:
    url = require("rabbitmq")
    yield url
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1"))
    channel = connection.channel()
    for name in (TO_CELERY, TO_CELERIAC):
        channel.queue_delete(name)
        channel.exchange_delete(name)
    connection.close()


@pytest.fixture(scope="module")
def app(amqp: str) -> Iterator[Celeriac]:
    app = Celeriac("compat-rpc", broker=f"{amqp}?layout=kombu", backend="rpc://",
                   task_track_started=True)
    yield app
    app.close()


@pytest.fixture(scope="module")
def fleet(fleet_factory: Any, amqp: str) -> Any:
    theirs = {"COMPAT_BROKER": amqp, "COMPAT_BACKEND": "rpc://"}
    ours = {"COMPAT_BROKER": f"{amqp}?layout=kombu", "COMPAT_BACKEND": "rpc://"}
    fleet_factory.celery_worker(theirs, "rpc-celery", TO_CELERY)
    fleet_factory.celeriac_worker(ours, "rpc-celeriac", TO_CELERIAC, "-c", "1")
    fleet_factory.celery = fleet_factory.client(theirs)
    return fleet_factory


def test_a_celery_client_reads_a_celeriac_workers_results(fleet: Any) -> None:
    out = fleet.celery.run(
        f"rs = [proj.add.apply_async((i, 1), queue={TO_CELERIAC!r}) for i in range(5)]\n"
        f"out = [r.get(timeout=20) for r in rs] + [proj.who.apply_async(('x',), "
        f"queue={TO_CELERIAC!r}).get(timeout=20)]")
    assert out == [1, 2, 3, 4, 5, ["celeriac", "x"]]
    failed = fleet.celery.run(
        f"r = proj.boom.apply_async(('nope',), queue={TO_CELERIAC!r})\n"
        "try:\n    r.get(timeout=20)\nexcept Exception as exc:\n"
        "    out = [type(exc).__name__, str(exc), r.state]")
    assert failed == ["ValueError", "nope", "FAILURE"]


def test_a_celeriac_client_reads_a_celery_workers_results(app: Celeriac, fleet: Any
                                                          ) -> None:
    results = [app.send_task("compat.add", [i, 2], queue=TO_CELERY) for i in range(5)]
    assert [r.get(timeout=20) for r in results] == [2, 3, 4, 5, 6]
    assert app.send_task("compat.who", ["y"], queue=TO_CELERY).get(timeout=20) == \
        ["celery", "y"]
    with pytest.raises(ValueError, match="nope"):
        app.send_task("compat.boom", ["nope"], queue=TO_CELERY).get(timeout=20)


def test_both_clients_at_once_each_read_their_own(app: Celeriac, fleet: Any) -> None:
    ours = app.send_task("compat.add", [100, 1], queue=TO_CELERIAC)
    theirs = fleet.celery.run(f"out = proj.add.apply_async((200, 2), "
                              f"queue={TO_CELERIAC!r}).get(timeout=20)")
    assert ours.get(timeout=20) == 101 and theirs == 202


def test_a_celeriac_chain_across_both_workers_replies_to_its_caller(app: Celeriac,
                                                                      fleet: Any) -> None:
    """Each step names the caller's queue (``reply_to``, as Celery's frozen chains do):
    a Celery worker sends the next step with it, not with a queue of its own."""
    def who(queue: str, *args: str) -> Any:
        return signature("compat.who", args, app=app).set(queue=queue)

    starts_on_celery = chain(who(TO_CELERY, "a"), who(TO_CELERIAC), who(TO_CELERY),
                             who(TO_CELERIAC)).apply_async()
    ends_on_celery = chain(who(TO_CELERIAC, "b"), who(TO_CELERY)).apply_async()
    assert starts_on_celery.get(timeout=30) == \
        ["celeriac", ["celery", ["celeriac", ["celery", "a"]]]]
    assert ends_on_celery.get(timeout=30) == ["celery", ["celeriac", "b"]]


def test_a_celery_chain_across_both_workers_replies_to_its_caller(fleet: Any) -> None:
    out = fleet.celery.run(
        f"c = chain(proj.who.s('a').set(queue={TO_CELERIAC!r}), "
        f"proj.who.s().set(queue={TO_CELERY!r}), proj.who.s().set(queue={TO_CELERIAC!r}))\n"
        f"d = chain(proj.who.s('b').set(queue={TO_CELERY!r}), "
        f"proj.who.s().set(queue={TO_CELERIAC!r}), proj.who.s().set(queue={TO_CELERY!r}))\n"
        "rc, rd = c.apply_async(), d.apply_async()\n"
        "out = [rc.get(timeout=30), rd.get(timeout=30)]")
    assert out == [["celeriac", ["celery", ["celeriac", "a"]]],
                   ["celery", ["celeriac", ["celery", "b"]]]]
