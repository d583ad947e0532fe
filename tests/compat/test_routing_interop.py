"""Broadcast and topic routing between a real Celery 5 fleet and celeriac's (issue 28).

Both sides declare the same ``task_queues`` (``COMPAT_QUEUES``): a ``Broadcast`` group and
two queues bound to one topic exchange by pattern, ``<img>`` by ``*.image.#`` (consumed
by the celeriac worker) and ``<video>`` by ``*.video.#`` (consumed by the Celery worker).
``compat.mark(key)`` appends the name of the fleet that ran it to the Redis list ``key``,
so a test sees who ran a task and how often.

- RabbitMQ (``amqp://...?layout=kombu``): a send to the Broadcast group, from either
  producer, runs once on each worker; a routing key reaches the queue whose pattern
  matches it on the other fleet, whichever producer sends it.
- Redis in kombu's layout: topic routing both ways (the celeriac worker binds its queue
  in kombu's ``_kombu.binding.<exchange>`` table, where Celery's producer looks);
  Broadcast is refused there (kombu's Redis fanout is lossy pub/sub); a topic message
  lost by a worker goes back to one queue, not to every queue its key matches.

Names carry a suffix of this run; results, marks and the Redis broker use database 13."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import kombu
import orjson
import pika
import pytest
import redis
from kombu import Exchange, Queue
from kombu.common import Broadcast

from celeriac import Celeriac, Settings
from celeriac.errors import ConfigurationError
from celeriac.testing import wait_until
from tests.compat.conftest import settle
from tests.loops import forget, run, track, until
from tests.services import reachable, require

pytestmark = pytest.mark.slow

DB = 13
REDIS = f"redis://127.0.0.1:6379/{DB}"
SUFFIX = uuid.uuid4().hex[:8]
BCAST, MEDIA = f"rt_bcast_{SUFFIX}", f"rt_media_{SUFFIX}"
IMG, VIDEO = f"rt_img_{SUFFIX}", f"rt_video_{SUFFIX}"
SPECS = [["broadcast", BCAST], ["topic", IMG, MEDIA, "*.image.#"],
         ["topic", VIDEO, MEDIA, "*.video.#"]]


def task_queues(*, broadcast: bool = True) -> list[Any]:
    media = Exchange(MEDIA, type="topic")
    queues: list[Any] = [Queue(IMG, media, routing_key="*.image.#"),
                         Queue(VIDEO, media, routing_key="*.video.#")]
    return [Broadcast(BCAST), *queues] if broadcast else queues


def env(broker: str, *, ours: bool, broadcast: bool = True) -> dict[str, str]:
    specs = SPECS if broadcast else SPECS[1:]
    return {"COMPAT_BROKER": f"{broker}?layout=kombu" if ours else broker,
            "COMPAT_BACKEND": f"{REDIS}?layout=celery" if ours else REDIS,
            "COMPAT_COUNTER": REDIS, "COMPAT_QUEUES": json.dumps(specs)}


def marks(key: str) -> list[str]:
    return [m.decode() for m in redis.Redis(db=DB).lrange(key, 0, -1)]


def wait_marks(key: str, count: int) -> list[str]:
    """The fleets that ran ``key``'s task once ``count`` runs are in (then a moment more,
    in which an extra copy would show)."""
    wait_until(lambda: len(marks(key)) >= count, 20, 0.05, f"{count} run(s) of {key}")
    return sorted(settle(lambda: marks(key) if len(marks(key)) > count else None, 0.5)
                  or marks(key))


def new_key(name: str) -> str:
    return f"rt:{SUFFIX}:{name}:{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module", autouse=True)
def cleanup() -> Iterator[None]:
    """Set up before the workers (autouse), so it cleans up after they have stopped."""
    require("redis")
    yield
    client = redis.Redis(db=DB)
    for pattern in (f"*{SUFFIX}*", "celery-task-meta-*", "_kombu.binding*"):
        keys = list(client.scan_iter(pattern, count=1000))
        if keys:
            client.delete(*keys)
    if not reachable("127.0.0.1", 5672):
        return
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1"))
    channel = connection.channel()
    for name in (IMG, VIDEO):  # each queue and the direct exchange Celery names after it
        channel.queue_delete(name)
        channel.exchange_delete(name)
    for name in (BCAST, MEDIA):  # the fanout queues were auto-delete
        channel.exchange_delete(name)
    connection.close()


# -- RabbitMQ ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def amqp() -> str:
    return require("rabbitmq")


@pytest.fixture(scope="module")
def amqp_fleet(fleet_factory: Any, amqp: str) -> Any:
    fleet_factory.celery_worker(env(amqp, ours=False), "rt-celery", f"{BCAST},{VIDEO}")
    fleet_factory.celeriac_worker(env(amqp, ours=True), "rt-celeriac", f"{BCAST},{IMG}",
                                  "-c", "1")
    fleet_factory.celery = fleet_factory.client(env(amqp, ours=False))
    return fleet_factory


@pytest.fixture(scope="module")
def amqp_app(amqp: str) -> Iterator[Celeriac]:
    app = Celeriac("rt-amqp", broker=f"{amqp}?layout=kombu", backend=f"{REDIS}?layout=celery",
                   task_queues=task_queues())
    yield app
    app.close()


def test_broadcast_runs_once_on_each_fleet_from_either_producer(
        amqp_app: Celeriac, amqp_fleet: Any) -> None:
    ours = new_key("bcast-ours")
    amqp_app.send_task("compat.mark", [ours], queue=BCAST)
    theirs = new_key("bcast-theirs")
    amqp_fleet.celery.run(f"proj.mark.apply_async(({theirs!r},), queue={BCAST!r})")
    assert wait_marks(ours, 2) == ["celeriac", "celery"]
    assert wait_marks(theirs, 2) == ["celeriac", "celery"]


def test_topic_key_reaches_the_other_fleet_on_rabbitmq(amqp_app: Celeriac,
                                                       amqp_fleet: Any) -> None:
    # Celery's producer: the queue names the exchange, the key picks the queues; RabbitMQ
    # routes by the binding our worker declared.
    to_ours = new_key("topic-to-ours")
    amqp_fleet.celery.run(f"proj.mark.apply_async(({to_ours!r},), queue={VIDEO!r}, "
                          "routing_key='x.image.png')")
    # Ours, both ways of saying it: the exchange, or a topic queue (Celery's form).
    to_theirs = new_key("topic-to-theirs")
    amqp_app.send_task("compat.mark", [to_theirs], exchange=MEDIA, routing_key="x.video.mp4")
    amqp_app.send_task("compat.mark", [to_theirs], queue=IMG, routing_key="y.video")
    assert wait_marks(to_ours, 1) == ["celeriac"]
    assert wait_marks(to_theirs, 2) == ["celery", "celery"]


# -- Redis, kombu's layout -----------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_fleet(fleet_factory: Any) -> Any:
    fleet_factory.celery_worker(env(REDIS, ours=False, broadcast=False), "rt-rcelery", VIDEO)
    fleet_factory.celeriac_worker(env(REDIS, ours=True, broadcast=False), "rt-rceleriac",
                                  IMG, "-c", "1")
    fleet_factory.rcelery = fleet_factory.client(env(REDIS, ours=False, broadcast=False))
    # Our worker binds its queue as it starts consuming; Celery's producer routes by it.
    wait_until(lambda: any(m.endswith(IMG.encode()) for m in
                           redis.Redis(db=DB).smembers(f"_kombu.binding.{MEDIA}")),
               20, 0.05, "the celeriac worker's topic binding")
    return fleet_factory


@pytest.fixture(scope="module")
def redis_app() -> Iterator[Celeriac]:
    app = Celeriac("rt-redis", broker=f"{REDIS}?layout=kombu",
                   backend=f"{REDIS}?layout=celery", task_queues=task_queues(broadcast=False))
    yield app
    app.close()


def test_topic_both_ways_on_kombu_redis(redis_app: Celeriac, redis_fleet: Any) -> None:
    to_ours = new_key("rtopic-to-ours")
    redis_fleet.rcelery.run(f"proj.mark.apply_async(({to_ours!r},), queue={VIDEO!r}, "
                            "routing_key='x.image.png')")
    to_theirs = new_key("rtopic-to-theirs")
    redis_app.send_task("compat.mark", [to_theirs], exchange=MEDIA, routing_key="x.video.mp4")
    redis_app.send_task("compat.mark", [to_theirs], queue=IMG, routing_key="y.video")
    assert wait_marks(to_ours, 1) == ["celeriac"]
    assert wait_marks(to_theirs, 2) == ["celery", "celery"]


def no_match_reaches_neither(app: Celeriac, celery: Any, keys: tuple[str, ...]) -> None:
    lost = new_key("topic-none")
    # Celery's producer drops such a message without a word (RabbitMQ, kombu's Redis).
    for key in keys:
        celery.run(f"proj.mark.apply_async(({lost!r},), queue={VIDEO!r}, routing_key={key!r})")
    # Ours refuses it and publishes nothing.
    with pytest.raises(ConfigurationError, match="matches its routing key"):
        app.send_task("compat.mark", [lost], exchange=MEDIA, routing_key="x.audio")
    # Messages sent after them reach each worker, so anything sent before has been seen.
    fence = new_key("topic-fence")
    celery.run(f"proj.mark.apply_async(({fence!r},), queue={IMG!r}, routing_key='a.image.b')")
    app.send_task("compat.mark", [fence], queue=VIDEO, routing_key="a.video.b")
    assert wait_marks(fence, 2) == ["celeriac", "celery"]
    assert marks(lost) == []


def test_a_key_no_pattern_matches_reaches_neither_fleet_on_rabbitmq(
        amqp_app: Celeriac, amqp_fleet: Any) -> None:
    no_match_reaches_neither(amqp_app, amqp_fleet.celery, ("x.audio.mp3",))


def test_a_key_no_pattern_matches_reaches_neither_fleet_on_kombu_redis(
        redis_app: Celeriac, redis_fleet: Any) -> None:
    # kombu's "#" needs a word after its dot: "x.image" matches no pattern there either.
    no_match_reaches_neither(redis_app, redis_fleet.rcelery, ("x.audio.mp3", "x.image"))
    client = redis.Redis(db=DB)
    assert [q for q in (IMG, VIDEO, "x.audio.mp3", "x.image") if client.llen(q)] == []


def test_topic_bindings_are_kombus_own() -> None:
    from kombu.transport.virtual.exchange import TopicExchange

    from celeriac.compat import kombu_wire as kw

    kombu_topic = TopicExchange(None)
    for pattern in ("*.image.#", "eu.#", "#", "a-b.c+d.*", "a.#.b", "ü.*", "x\x00y"):
        member = kw.topic_member("q", pattern)
        assert member.split(kw.SEP) == [pattern, kombu_topic.key_to_pattern(pattern), "q"]
    members = [m.split(kw.SEP) for m in (kw.topic_member("b", "*.image.#"),
                                         kw.topic_member("a", "#.png"), kw.binding_member("d"))]
    assert kw.bound_queue(members, "d") == "d"  # direct first
    assert kw.bound_queue(members, "x.image.png") == "a"  # the first by name that matches
    assert kw.bound_queue(members, "x.image.gif") == "b"
    assert kw.bound_queue(members, "x.video") is None


def restoring() -> Any:
    from celeriac.compat.redis_broker import KombuRedisTransport
    from celeriac.transports import create_transport

    url = f"{REDIS}?layout=kombu&visibility_timeout=1"
    t = create_transport(url, Settings(broker_url=url))
    assert isinstance(t, KombuRedisTransport)
    return t


def test_a_lost_topic_message_goes_back_to_one_queue() -> None:
    # kombu (Celery's producer) routes one message into two queues of the exchange.
    exchange, spare, eu = f"rt_restore_{SUFFIX}", f"rt_spare_{SUFFIX}", f"rt_eu_{SUFFIX}"
    with kombu.Connection(REDIS) as conn:
        for q, p in ((spare, "*.image.#"), (eu, "eu.#")):
            Queue(q, Exchange(exchange, type="topic"), routing_key=p)(
                conn.default_channel).declare()
        conn.Producer().publish({"x": 1}, exchange=exchange, routing_key="eu.image.png")
    client = redis.Redis(db=DB)
    assert client.llen(spare) == 1 and client.llen(eu) == 1
    dead, live = track(restoring()), track(restoring())

    async def go() -> None:
        await dead.connect("dead")
        await live.connect("live")
        # Ours fetches one copy and dies: that copy goes back to its own queue alone.
        [held] = await dead.fetch([spare], 10, 1.0)
        assert orjson.loads(client.hget("unacked", held.tag.tag) or b"")[1:] == ["", spare]
        # A kombu worker's entry names the exchange: back to the queue the key matches.
        raw = client.rpop(eu)
        client.hset("unacked", f"rt-tag-{SUFFIX}",
                    orjson.dumps([orjson.loads(raw or b""), exchange, "eu.video"]))
        client.zadd("unacked_index", {f"rt-tag-{SUFFIX}": time.time() - 60})
        restored = 0

        async def restore() -> bool:
            nonlocal restored
            restored += await live.renew_lease()
            return restored >= 2

        await until(restore, interval=0.1, message="both messages restored")

    try:
        run(go())
        assert client.llen(spare) == 1 and client.llen(eu) == 1
    finally:
        forget()
        dead.close()
        live.close()


def test_broadcast_is_refused_on_kombu_redis() -> None:
    app = Celeriac("rt-redis-bcast", broker=f"{REDIS}?layout=kombu",
                   backend=f"{REDIS}?layout=celery", task_queues=task_queues())
    try:
        with pytest.raises(ConfigurationError, match="fanout"):
            app.send_task("compat.mark", [new_key("rbcast")], queue=BCAST)
    finally:
        app.close()
    # A worker that would consume it does not start (the consumer binds it first).
    worker_side = restoring()
    with pytest.raises(ConfigurationError, match=r"Broadcast .* use RabbitMQ"):
        asyncio.run(worker_side.bind_fanout(BCAST, f"{BCAST}.w@h"))
    worker_side.close()
