"""What the Redis transport and backend promise beyond the shared contracts: round trips,
failover, connection loss, the lease sweep at scale, bad envelopes, pub/sub, the change
feed. Each test uses its own namespace on the shared Redis and deletes its keys after.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis

from celeriac import states
from celeriac.backends import redis as redis_backend
from celeriac.backends.redis import RedisBackend
from celeriac.clients.net import mask_password
from celeriac.clients.redis import script_source
from celeriac.errors import BrokerUnavailable, OperationalError
from celeriac.protocol import DECODE_ERROR_HEADER, Delivery
from celeriac.settings import Settings
from celeriac.testing import wait_until
from celeriac.transports.base import Outgoing
from celeriac.transports.redis import RedisTransport
from tests.contracts import redis_support
from tests.contracts.redis_support import ids, message
from tests.loops import run, until
from tests.services import IN_CI, reachable, require

# The shared fixtures: a namespace of the test's own, its URL, transports made in it.
ns, url, make = redis_support.ns, redis_support.url, redis_support.make

T = TypeVar("T")
Q = "specific"
DOWN = "redis://127.0.0.1:1/0"
"""Nothing listens on port 1: connections are refused at once."""


def count_commands(client: Any, sent: list[str] | None = None) -> list[str]:
    """Record the name of every command ``client`` sends from now on: a redis-py client,
    or a lane (``celeriac.clients.redis.lanes``: scripts go through lanes)."""
    sent = [] if sent is None else sent
    name = "call" if hasattr(client, "evalsha") and hasattr(client, "call") else \
        "execute_command"
    real = getattr(client, name)
    if inspect.iscoroutinefunction(real):
        async def acounting(*args: Any, **kw: Any) -> Any:
            sent.append(str(args[0]))
            return await real(*args, **kw)
        setattr(client, name, acounting)
    else:
        def counting(*args: Any, **kw: Any) -> Any:
            sent.append(str(args[0]))
            return real(*args, **kw)
        setattr(client, name, counting)
    return sent


# -- round trips --------------------------------------------------------------------------

def test_publish_many_fetch_and_ack_of_a_batch_are_one_round_trip_each(
        make: Callable[..., RedisTransport]) -> None:
    producer = make()
    producer.publish(Q, message(-1))  # loads the script, so that the count below is exact
    sent = count_commands(producer.conn._sync_lane())
    producer.publish_many([Outgoing(Q if n % 2 else "other", message(n, priority=n % 10))
                           for n in range(100)])
    assert sent == ["EVALSHA"]

    async def scenario() -> None:
        c = make()
        await c.connect("c1")
        await c.fetch([Q], 1, 1.0)  # loads the fetch script
        await c.ack(await c.fetch([Q, "other"], 1, 1.0))
        sent = count_commands(await c.conn._async_lane(), count_commands(c.conn.aclient()))
        batch = await c.fetch([Q, "other"], 60, 1.0)
        assert len(batch) == 60 and sent == ["EVALSHA"]
        # Across both queues in one call: by priority, then in publish order.
        keys = [(-d.message.priority, int(d.message.headers["id"][3:])) for d in batch]
        assert keys == sorted(keys)
        await c.ack(batch)
        assert sent == ["EVALSHA", "EVALSHA"]
        await c.disconnect()

    run(scenario())
    # 101 published, 61 acked; the one fetched unacked went back on disconnect.
    assert producer.queue_length(Q) + producer.queue_length("other") == 101 - 61


def test_an_idle_fetch_blocks_in_redis_instead_of_polling(make: Callable[..., RedisTransport]
                                                          ) -> None:
    async def scenario() -> tuple[list[str], float, float]:
        c = make()
        await c.connect("idle")
        await c.fetch([Q], 1, 0.0)
        sent = count_commands(await c.conn._async_lane(), count_commands(c.conn.aclient()))
        cpu, t0 = time.thread_time(), time.monotonic()
        assert await c.fetch([Q], 10, 1.0) == []
        return sent, time.thread_time() - cpu, time.monotonic() - t0

    sent, cpu, waited = run(scenario())
    # A fetch, one long BLPOP, the fetch that ends it (on a slow machine perhaps one more
    # short round).
    assert sent[:3] == ["EVALSHA", "BLPOP", "EVALSHA"] and len(sent) <= 5
    assert waited >= 0.99 and cpu < 0.05


# -- leases -------------------------------------------------------------------------------

def test_one_heartbeat_returns_all_2000_messages_of_an_expired_consumer(
        make: Callable[..., RedisTransport]) -> None:
    producer = make()
    producer.publish_many([Outgoing(Q, message(n)) for n in range(2000)])

    async def scenario() -> None:
        # Its own lease long: on a loaded machine fetching and acking 2,000 messages may
        # take longer than the dead one's 0.2 s, and must not lose them to itself. It
        # connects first: a connect renews, and on a loaded machine the dead one's lease
        # may already have run out by then (the messages would come back before we look).
        live = make(worker_lease_timeout=10)
        await live.connect("live")
        dead = make(worker_lease_timeout=0.2)
        await dead.connect("dead")
        assert len(await dead.fetch([Q], 2000, 1.0)) == 2000
        assert producer.queue_length(Q) == 0
        renewals: list[int] = []

        async def returned() -> int:  # nothing until the dead one's 0.2 s lease runs out
            renewals.append(await live.renew_lease())
            return renewals[-1]

        await until(returned, message="the dead consumer's messages returned")
        assert renewals[-1] == 2000
        assert producer.queue_length(Q) == 2000
        again = await live.fetch([Q], 2000, 1.0)
        assert ids(again) == [f"id-{n}" for n in range(2000)]
        assert {d.delivery_count for d in again} == {2}
        await live.ack(again)
        await live.disconnect()

    run(scenario())
    assert producer.queue_length(Q) == 0


def test_a_lost_fetch_reply_is_noticed_and_its_messages_given_back(
        make: Callable[..., RedisTransport]) -> None:
    """The fetch script ran, but its reply never arrived: those messages are ours in Redis
    and unknown to us. The next fetch gives them back, uncounted, instead of holding them
    for as long as the worker lives."""
    producer = make()
    producer.publish_many([Outgoing(Q, message(n)) for n in range(6)])
    fetch_sha = hashlib.sha1(script_source("fetch").encode()).hexdigest()

    async def scenario() -> list[Delivery]:
        c = make()
        await c.connect("c1")
        lane = await c.conn._async_lane()
        assert lane is not None
        real, armed = lane.evalsha, [True]

        async def reply_lost(sha: str, source: str, args: Any) -> Any:
            result = await real(sha, source, args)
            if sha == fetch_sha and armed:
                armed.clear()
                raise redis.ConnectionError("connection reset by peer (test)")
            return result

        lane.evalsha = reply_lost  # type: ignore[method-assign]
        first = await c.fetch([Q], 3, 1.0)  # the retry's batch: id-3..5
        rest = await c.fetch([Q], 10, 1.0)  # id-0..2, given back by this call
        await c.ack(first + rest)
        await c.disconnect()
        return first + rest

    got = run(scenario())
    assert sorted(ids(got)) == [f"id-{n}" for n in range(6)]
    assert {d.delivery_count for d in got} == {1}
    assert producer.queue_length(Q) == 0


def test_connecting_under_the_id_of_a_dead_consumer_returns_its_messages(
        make: Callable[..., RedisTransport]) -> None:
    make().publish_many([Outgoing(Q, message(n)) for n in range(3)])

    async def scenario() -> list[Delivery]:
        first = make()
        await first.connect("same-id")
        assert len(await first.fetch([Q], 2, 1.0)) == 2  # then it dies, silently
        again = make()
        await again.connect("same-id")  # a new life under the old name
        got = await again.fetch([Q], 10, 1.0)
        await again.ack(got)
        await again.disconnect()
        return got

    got = run(scenario())
    assert ids(got) == ["id-0", "id-1", "id-2"]
    assert [d.delivery_count for d in got] == [2, 2, 1]


# -- bad input and administration ---------------------------------------------------------

def test_an_undecodable_envelope_is_delivered_for_dead_lettering(
        make: Callable[..., RedisTransport], ns: str) -> None:
    producer = make()
    producer.publish(Q, message(1))
    admin = redis.Redis()
    [key] = admin.keys(f"{ns}:m:*")
    admin.delete(key)  # rewritten in the earlier layout (a hash), with a broken envelope
    admin.hset(key, mapping={"q": Q, "s": 9, "e": b"\xff not json", "b": b"b1"})
    admin.close()

    async def scenario() -> None:
        c = make()
        await c.connect("c1")
        [d] = await c.fetch([Q], 1, 1.0)
        assert "malformed message envelope" in d.message.headers[DECODE_ERROR_HEADER]
        assert d.message.body == b"b1"
        await c.dead_letter(d, "malformed message")

    run(scenario())
    [dead] = producer.dead_letters()
    assert dead.reason == "malformed message" and dead.message.body == b"b1"
    assert DECODE_ERROR_HEADER in dead.message.headers


def test_dead_letters_requeue_and_purge(make: Callable[..., RedisTransport]) -> None:
    producer = make()
    producer.publish_many([Outgoing(Q, message(n)) for n in range(4)])

    async def scenario() -> None:
        c = make()
        await c.connect("c1")
        for d in await c.fetch([Q], 3, 1.0):
            await c.dead_letter(d, f"reason {d.message.headers['id']}")
        await c.disconnect()

    run(scenario())
    letters = producer.dead_letters()
    assert [d.reason for d in letters] == ["reason id-0", "reason id-1", "reason id-2"]
    assert all(isinstance(d.id, int) for d in letters)
    # Back as a new message: behind id-3, which was waiting all along; count reset.
    assert producer.requeue_dead([str(letters[0].id), 999999]) == 1
    assert producer.purge_dead([letters[1].id]) == 1
    assert [d.reason for d in producer.dead_letters()] == ["reason id-2"]
    assert producer.purge_dead() == 1
    assert producer.dead_letters() == []

    async def drain() -> list[Delivery]:
        c = make()
        await c.connect("c2")
        return await c.fetch([Q], 10, 1.0)

    got = run(drain())
    assert ids(got) == ["id-3", "id-0"]
    assert [d.delivery_count for d in got] == [1, 1]


def test_namespaces_do_not_see_each_other(make: Callable[..., RedisTransport], ns: str
                                         ) -> None:
    base = require("redis")
    a = make(f"{base}?namespace={ns}:a")  # under the fixture's prefix: cleaned up with it
    b = make(f"{base}?namespace={ns}:b")
    a.publish(Q, message(1))
    assert (a.queue_length(Q), b.queue_length(Q)) == (1, 0)
    assert a.purge(Q) == 1


# -- broadcast ----------------------------------------------------------------------------

def test_broadcast_reaches_every_current_subscriber_in_order(
        make: Callable[..., RedisTransport]) -> None:
    producer = make()
    producer.broadcast("events", b"before anyone listens")

    async def scenario() -> None:
        t = make()
        subs = [await t.subscribe("events"), await t.subscribe("events")]
        other = await t.subscribe("control")
        for n in range(3):
            producer.broadcast("events", b"e%d" % n)
        for s in subs:
            assert [await s.get(1.0) for _ in range(3)] == [b"e0", b"e1", b"e2"]
        t0 = time.monotonic()
        assert await subs[0].get(0.1) is None
        assert 0.09 <= time.monotonic() - t0 < 0.3
        assert await other.get(0.05) is None
        for s in [*subs, other]:
            await s.close()
        await t.conn.aclose()

    run(scenario())


# -- connections --------------------------------------------------------------------------

@pytest.mark.parametrize("strategy", ["round-robin", "shuffle"])
def test_failover_to_the_next_url_when_the_first_is_down(
        make: Callable[..., RedisTransport], url: str, strategy: str) -> None:
    producer = make(f"{DOWN}?namespace=x;{url}", broker_failover_strategy=strategy,
                    broker_connection_max_retries=1)
    producer.publish(Q, message(1))
    assert producer.queue_length(Q) == 1

    async def scenario() -> list[Delivery]:
        c = make(f"{DOWN};{url}", broker_failover_strategy=strategy)
        await c.connect("c1")  # fails over while connecting
        got = await c.fetch([Q], 10, 1.0)
        await c.ack(got)
        return got

    assert ids(run(scenario())) == ["id-1"]


def test_an_unreachable_broker_raises_naming_the_url_without_the_password(
        make: Callable[..., RedisTransport], caplog: pytest.LogCaptureFixture) -> None:
    secret_url = "redis://user:s3cr3t@127.0.0.1:1/0?namespace=x"
    assert mask_password(secret_url) == "redis://user:***@127.0.0.1:1/0?namespace=x"
    producer = make(secret_url, broker_connection_max_retries=2)
    caplog.set_level(logging.WARNING, "celeriac.redis")
    with pytest.raises(BrokerUnavailable) as info:
        producer.publish(Q, message(1))
    text = str(info.value)
    assert "redis://user:***@127.0.0.1:1/0" in text and "after 3 attempt(s)" in text
    assert "s3cr3t" not in text and "s3cr3t" not in caplog.text
    assert len([r for r in caplog.records if "retry" in r.getMessage()]) == 2

    no_retry = make(secret_url, broker_connection_retry=False)
    t0 = time.monotonic()
    with pytest.raises(OperationalError, match="after 1 attempt"):
        no_retry.queue_length(Q)
    assert time.monotonic() - t0 < 0.5

    async def worker_side() -> None:
        c = make(secret_url)
        with pytest.raises(BrokerUnavailable) as info:
            await c.connect("c1")
        assert "user:***@" in str(info.value) and "s3cr3t" not in str(info.value)

    run(worker_side())


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[tuple[int, Callable[[], None], Callable[[], None]]]:
    """A Redis server of this test's own: (port, stop, start)."""
    exe = shutil.which("redis-server")
    if exe is None:
        if IN_CI:
            pytest.fail("redis-server is not installed")
        pytest.skip("redis-server is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
            "no", "--dir", str(tmp_path)]
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL))
        wait_until(lambda: reachable("127.0.0.1", port, 0.1), 10, 0.02,
                   message="redis-server started")

    def stop() -> None:
        procs[-1].kill()
        procs[-1].wait(10)

    start()
    yield port, stop, start
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(5)


def test_worker_calls_raise_while_redis_is_down_and_reconnect_after(
        make: Callable[..., RedisTransport],
        own_redis: tuple[int, Callable[[], None], Callable[[], None]]) -> None:
    port, stop, start = own_redis
    url = f"redis://127.0.0.1:{port}/0?namespace=r"
    producer = make(url, broker_connection_max_retries=0)

    async def scenario() -> None:
        c = make(url)
        await c.connect("c1")
        producer.publish(Q, message(1))
        assert ids(await c.fetch([Q], 1, 1.0)) == ["id-1"]
        stop()
        with pytest.raises(BrokerUnavailable, match=f"127.0.0.1:{port}"):
            await c.fetch([Q], 1, 0.5)
        with pytest.raises(BrokerUnavailable):
            producer.publish(Q, message(2))
        start()  # an empty server: no persistence
        await c.renew_lease()  # the next call reconnects by itself
        producer.publish(Q, message(3))
        assert ids(await c.fetch([Q], 1, 1.0)) == ["id-3"]
        await c.disconnect()

    run(scenario())


# -- result backend -----------------------------------------------------------------------

def _backend(url: str, **settings: Any) -> RedisBackend:
    return RedisBackend(url, Settings(result_backend=url, **settings))


def test_result_expiry_is_redis_own(url: str, ns: str) -> None:
    expiring, forever = _backend(url, result_expires=60), _backend(url, result_expires=None)
    expiring.store("e", states.SUCCESS, 1)
    forever.store("f", states.SUCCESS, 2)
    admin = redis.Redis()
    assert 59_000 < admin.pttl(f"{ns}:r:e") <= 60_000
    assert admin.pttl(f"{ns}:r:f") == -1
    expiring.store("f", states.SUCCESS, 3)  # a later store with an expiry sets one
    assert admin.pttl(f"{ns}:r:f") > 0
    admin.close()
    expiring.close()
    forever.close()


def test_get_wakes_at_once_on_the_store(url: str) -> None:
    """The mechanism, a woken wait: nothing polls, so a missed wake-up would return at
    the wait's 5 s timeout. Woken, the median is about a millisecond; the bound leaves a
    loaded machine's scheduling room."""
    waiter, writer = _backend(url), _backend(url)
    latencies = []
    for n in range(5):
        storing: list[float] = []

        def store_later(n: int = n, storing: list[float] = storing) -> None:
            time.sleep(0.05)  # sleep-ok: store after the waiter is asleep
            # Timed from the start of the store: the waiter (its read pipelined behind
            # its wait) may well return before the writer's own reply is read.
            storing.append(time.monotonic())
            writer.store(f"t-{n}", states.SUCCESS, n)

        thread = threading.Thread(target=store_later)
        thread.start()
        got = waiter.wait_for([f"t-{n}"], 5.0)
        latencies.append(time.monotonic() - storing[0] if storing else 1.0)
        thread.join(5)
        assert got[f"t-{n}"].result == n
    assert sorted(latencies)[2] < 0.25, latencies
    waiter.close()
    writer.close()


def test_a_waiter_whose_cursor_was_trimmed_away_rescans(
        url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redis_backend, "FEED_LENGTH", 10)
    b = _backend(url)
    b.store("first", states.SUCCESS, 0)
    cursor = b._cursor()
    for n in range(300):  # well past MAXLEN ~ 10: whole stream nodes get trimmed
        b.store(f"t-{n}", states.SUCCESS, n)
    assert b._changes(cursor) is None
    fresh = b._cursor()
    b.store("late", states.SUCCESS, 1)
    assert b._changes(fresh) == (b._cursor(), ["late"])
    b.close()


def test_has_subscribers_says_whether_a_broadcast_would_reach_anyone(
        make: Callable[..., RedisTransport],
        own_redis: tuple[int, Callable[[], None], Callable[[], None]]) -> None:
    """The events sender skips a batch nobody would get: only when Redis says so. On a
    Redis of its own: pub/sub is server-wide, and a pattern subscriber anywhere on the
    shared one (Celery's workers in tests/compat, which ``make test`` runs beside this)
    counts as a listener of every channel."""
    port = own_redis[0]
    t = make(f"redis://127.0.0.1:{port}/0?namespace=r")
    admin = redis.Redis(host="127.0.0.1", port=port)
    assert not admin.pubsub_numpat()
    assert t.has_subscribers("celeriac.events") is False

    async def subscribed() -> bool:
        sub = await t.subscribe("celeriac.events")
        try:
            t.broadcast("celeriac.events", b"[1]")
            assert await sub.get(5) == b"[1]"
            return t.has_subscribers("celeriac.events")
        finally:
            await sub.close()

    assert run(subscribed()) is True
    # Closing drops the connection; Redis forgets the subscription once it sees that.
    wait_until(lambda: not t.has_subscribers("celeriac.events"), 5,
               message="the subscription gone")
    sniffer = admin.pubsub()
    sniffer.psubscribe("somebody-else:*")  # a pattern may match any channel: count it
    try:
        assert sniffer.get_message(timeout=5) is not None  # the psubscribe confirmation
        assert t.has_subscribers("celeriac.events") is True
    finally:
        sniffer.close()
        admin.close()


def test_has_subscribers_says_yes_when_an_acl_refuses_pubsub(
        ns: str, caplog: pytest.LogCaptureFixture) -> None:
    """A user whose ACL lacks PUBSUB still gets its events out (broadcast as if heard)."""
    caplog.set_level(logging.INFO, "celeriac")
    admin = redis.Redis.from_url(require("redis"))
    user, password = f"celeriac-test-{ns}", "pw-" + ns
    admin.acl_setuser(user, enabled=True, passwords=[f"+{password}"], keys=["*"],
                      channels=["*"], commands=["+@all", "-pubsub"])
    host, port = admin.connection_pool.connection_kwargs["host"], \
        admin.connection_pool.connection_kwargs["port"]
    url = f"redis://{user}:{password}@{host}:{port}/0?namespace={ns}"
    t = RedisTransport(url, Settings(broker_url=url, broker_connection_retry=False))
    try:
        assert t.has_subscribers("celeriac.events") is True
        assert "cannot tell who subscribed" in caplog.text and "NOPERM" in caplog.text
        t.broadcast("celeriac.events", b"[]")  # PUBLISH itself is allowed
    finally:
        t.close()
        admin.acl_deluser(user)
        admin.close()
