"""Topic exchanges: binding patterns route as RabbitMQ's topic exchange does, on Redis
and RabbitMQ alike (the producer matches the routing key against the bindings
``task_queues`` declares and publishes a copy to each queue that matches; the worker
side is plain queues, run end to end in ``test_broadcast.py``'s fleet)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kombu import Exchange, Queue

from celeriac import Celeriac
from celeriac.errors import ConfigurationError
from celeriac.settings.routing import Route, topic_matches
from tests.contracts.conftest import _drop_amqp_namespace, _drop_redis_namespace
from tests.services import require

MEDIA = Exchange("media", type="topic")
QUEUES = (Queue("images", MEDIA, routing_key="*.image.#"),
          Queue("eu", MEDIA, routing_key="eu.#"),
          Queue("pngs", MEDIA, routing_key="#.png"),
          Queue("celery"))


@pytest.mark.parametrize(("pattern", "key", "matches"), [
    ("*.image.#", "eu.image", True),
    ("*.image.#", "eu.image.png.large", True),
    ("*.image.#", "image.png", False),
    ("*.image.#", "eu.us.image", False),
    ("#", "", True),
    ("#", "a.b.c", True),
    ("a.#", "a", True),
    ("#.a", "a", True),
    ("#.a", "b.c.a", True),
    ("a.*", "a", False),
    ("a.*", "a.b.c", False),
    ("a.#.c", "a.c", True),
    ("a.#.c", "a.x.y.c", True),
    ("a.#.#.c", "a.c", True),
    ("a.b", "a.b", True),
    ("a.b", "a.bb", False),
])
def test_topic_matching_is_rabbitmqs(pattern: str, key: str, matches: bool) -> None:
    assert topic_matches(pattern, key) is matches


def test_routes_and_default_exchange_resolve_to_the_matching_queues() -> None:
    app = Celeriac("topics", broker_url="memory://", task_queues=QUEUES,
                   task_routes={"t.thumb": {"exchange": "media",
                                            "routing_key": "eu.image.png"}})
    route = app.route("t.thumb")
    assert isinstance(route, Route) and route == "media"
    assert route.queues == ("images", "eu", "pngs")
    assert app.route("t.other") == "celery"
    # Celery's docs' form: queues bound to a topic task_default_exchange by pattern.
    app = Celeriac("topics2", broker_url="memory://", task_default_exchange="tasks",
                   task_default_exchange_type="topic", task_default_routing_key="task.default",
                   task_queues=(Queue("feed", routing_key="feed.#"),
                                Queue("regular", routing_key="task.#")))
    assert app.routing.default.queues == ("regular",)
    assert app.routing.resolve(None, None, "feed.rss").queues == ("feed",)


@pytest.fixture(params=["redis", "rabbitmq"])
def app(request: pytest.FixtureRequest) -> Iterator[Celeriac]:
    ns = f"tp{uuid.uuid4().hex[:10]}"
    url = (f"{require('redis')}?namespace={ns}" if request.param == "redis"
           else f"{require('rabbitmq')}?namespace={ns}.")
    app = Celeriac("topics", broker_url=url, result_backend="memory://", task_queues=QUEUES)
    try:
        yield app
    finally:
        app.close()
        if request.param == "redis":
            _drop_redis_namespace(url)
        else:
            _drop_amqp_namespace(url, ("images", "eu", "pngs", "celery"), ())


def test_a_message_reaches_every_queue_whose_pattern_matches(app: Celeriac) -> None:
    app.send_task("t.thumb", exchange="media", routing_key="eu.image.png")
    app.send_task("t.thumb", exchange=MEDIA, routing_key="us.image.gif")
    app.send_task("t.thumb", exchange="media", routing_key="eu.video")
    lengths = {q: app.transport.queue_length(q) for q in ("images", "eu", "pngs", "celery")}
    assert lengths == {"images": 2, "eu": 2, "pngs": 1, "celery": 0}


def test_a_key_no_binding_matches_is_refused_and_nothing_is_sent(app: Celeriac) -> None:
    with pytest.raises(ConfigurationError, match="no queue bound to the topic exchange"):
        app.send_task("t.thumb", exchange="media", routing_key="us.video")
    assert sum(app.transport.queue_length(q) for q in ("images", "eu", "pngs")) == 0


def test_on_rabbitmq_a_publish_to_the_topic_exchange_reaches_a_consumed_queue() -> None:
    """What a Celery producer does (publish to the exchange with a key) reaches the
    queues a celeriac worker consumes: it binds them to the exchange by their pattern."""
    import pika

    from celeriac.protocol import Message, new_id, task_headers, task_properties
    from celeriac.transports.amqp import wire
    from celeriac.transports.amqp.client import _Encoded
    from tests.loops import run, track

    ns = f"tx{uuid.uuid4().hex[:10]}."
    url = f"{require('rabbitmq')}?namespace={ns}"
    app = Celeriac("topics", broker_url=url, result_backend="memory://", task_queues=QUEUES)
    task_id = new_id()
    message = Message(task_headers(task="t.thumb", task_id=task_id, args_repr="()",
                                   kwargs_repr="{}"), b"[[], {}, {}]", "application/json",
                      "utf-8", task_properties(task_id, 0))

    async def scenario() -> None:
        worker = track(app.transport)
        await worker.connect("c1")
        assert await worker.fetch(["images", "eu"], 10, 0.1) == []  # consuming: bound
        conn = pika.BlockingConnection(pika.URLParameters(
            require("rabbitmq").rstrip("/") + "/%2F"))
        try:
            conn.channel().basic_publish(f"{ns}media", "eu.image.png", message.body,
                                         _Encoded(wire.encode_properties(
                                             wire.wire_properties(message))))
        finally:
            conn.close()
        got: list[Any] = []
        for _ in range(50):
            got += await worker.fetch(["images", "eu"], 10, 0.2)
            if len(got) == 2:
                break
        assert sorted(d.queue for d in got) == ["eu", "images"]
        await worker.ack(got)

    try:
        run(scenario())
    finally:
        app.close()
        _drop_amqp_namespace(url, ("images", "eu", "pngs", "celery", "media"), ())
