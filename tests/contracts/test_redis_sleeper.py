"""The Redis transport's sleeper (``RedisTransport.wait_ready``): the fetch goes pipelined
behind the BLPOP on a connection of its own, so a wake-up brings its messages in the same
round trip. What must hold with it: the messages arrive held and counted once, a wait
that ends with nothing registers the consumer as idle again, a delayed message wakes it
when due, and a fetch whose reply is abandoned (the sleeper cancelled as it ran) is given
back, not kept. Each test uses its own namespace on the shared Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from celeriac.errors import BrokerUnavailable
from celeriac.testing import wait_until
from celeriac.transports.base import Outgoing
from celeriac.transports.redis import RedisTransport
from tests.contracts import redis_support
from tests.contracts.redis_support import ids, message
from tests.contracts.test_redis_specific import own_redis
from tests.loops import run, until

ns, url, make = redis_support.ns, redis_support.url, redis_support.make
own_redis = own_redis  # the fixture: a Redis server of the test's own

Q = "sleeper"


def blocked(admin: redis.Redis, ns: str) -> bool:
    """Whether a connection of namespace ``ns`` is blocked in BLPOP."""
    return any(c.get("cmd") == "blpop" and c.get("name", "").endswith(f":{ns}")
               for c in admin.client_list())


def counting(calls: list[str], target: Any, name: str) -> None:
    """Record the first argument of every ``target.<name>(...)`` call from now on."""
    real = getattr(target, name)

    def wrapper(*args: Any, **kw: Any) -> Any:
        calls.append(str(args[0]))
        return real(*args, **kw)

    setattr(target, name, wrapper)


def test_a_wake_brings_the_message_in_the_sleepers_own_round_trip(
        make: Callable[..., RedisTransport], ns: str) -> None:
    producer = make()
    admin = redis.Redis()

    async def scenario() -> tuple[list[Any], list[str], float]:
        c = make()
        await c.connect("c1")
        assert await c.settle_and_fetch([], [], None, [Q], 4) == []  # short: idle
        shared = await c.conn._async_lane()
        assert shared is not None
        others: list[str] = []
        counting(others, shared, "call")
        counting(others, c.conn.aclient(), "execute_command")
        began = time.monotonic()
        sleeping = asyncio.ensure_future(c.wait_ready([Q], 4, 5.0))
        await until(lambda: blocked(admin, ns), message="the sleeper's BLPOP")
        producer.publish(Q, message(1))
        got = await sleeping
        waited = time.monotonic() - began
        assert c._held == {d.tag for d in got}
        before_ack = list(others)
        await c.ack(got)
        await c.disconnect()
        return got, before_ack, waited

    got, others, waited = run(scenario())
    admin.close()
    assert ids(got) == ["id-1"] and got[0].delivery_count == 1
    # Nothing went over the pump's connections: the BLPOP and the fetch were the sleeper's.
    assert others == []
    assert waited < 4.5  # woken by the publish, not by its 5 s timeout
    assert producer.queue_length(Q) == 0


def test_a_wait_that_ends_empty_fetches_and_registers_idle_again(
        make: Callable[..., RedisTransport], ns: str) -> None:
    producer = make()
    admin = redis.Redis()

    async def scenario() -> tuple[list[Any] | None, list[Any] | None]:
        c = make()
        await c.connect("c1")
        await c.settle_and_fetch([], [], None, [Q], 4)
        empty = await c.wait_ready([Q], 4, 0.05)  # times out: the fetch behind it runs
        assert admin.sismember(f"{ns}:idle:{Q}", "c1")  # registered again
        producer.publish(Q, message(2))  # leaves a token: the next wait returns at once
        assert admin.llen(f"{ns}:wake:c1") == 1
        got = await c.wait_ready([Q], 4, 5.0)
        await c.ack(got or [])
        await c.disconnect()
        return empty, got

    empty, got = run(scenario())
    admin.close()
    assert empty == []
    assert got is not None and ids(got) == ["id-2"]


def test_a_delayed_message_wakes_the_sleeper_when_due(
        make: Callable[..., RedisTransport]) -> None:
    producer = make()

    async def scenario() -> tuple[list[Any], float]:
        c = make()
        await c.connect("c1")
        # Timed from before the publish: the delay runs from a moment inside that call,
        # and on a loaded machine the calls after it may take a good part of the delay.
        began = time.monotonic()
        producer.publish(Q, message(3), delay=0.3)
        assert await c.settle_and_fetch([], [], None, [Q], 4) == []
        got: list[Any] = []
        while not got:  # a wake-up may come early (the publish's own token)
            got = await c.wait_ready([Q], 4, 5.0) or []
            assert time.monotonic() - began < 4.5
        waited = time.monotonic() - began
        await c.ack(got)
        await c.disconnect()
        return got, waited

    got, waited = run(scenario())
    assert ids(got) == ["id-3"]
    assert waited >= 0.29  # not before it was due (Redis's clock counts milliseconds)


def test_a_fetch_abandoned_by_a_cancelled_sleeper_is_given_back(
        make: Callable[..., RedisTransport], ns: str) -> None:
    """The sleeper is cancelled (the worker stops fetching) after Redis ran the fetch
    behind its BLPOP but before its reply was read: Redis has the message as ours and we
    never saw it. The next fetch gives it back uncounted (and takes it again)."""
    producer = make()
    admin = redis.Redis()

    async def scenario() -> list[Any]:
        c = make()
        await c.connect("c1")
        await c.settle_and_fetch([], [], None, [Q], 4)
        sleeping = asyncio.ensure_future(c.wait_ready([Q], 4, 5.0))
        await until(lambda: blocked(admin, ns), message="the sleeper's BLPOP")
        # Synchronous from here to the cancel: the loop does not turn, so the sleeper
        # cannot read the reply that Redis sends once the publish wakes it.
        producer.publish(Q, message(4))
        wait_until(lambda: admin.smembers(f"{ns}:owned:c1"), message="the fetch ran")
        sleeping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sleeping
        assert c._suspect and not c._held
        again = await c.settle_and_fetch([], [], None, [Q], 4)
        await c.ack(again)
        await c.disconnect()
        return again

    got = run(scenario())
    admin.close()
    assert ids(got) == ["id-4"] and got[0].delivery_count == 1
    assert producer.queue_length(Q) == 0


def test_the_sleeper_reconnects_and_loads_its_script_after_a_restart(
        make: Callable[..., RedisTransport],
        own_redis: tuple[int, Callable[[], None], Callable[[], None]]) -> None:
    """A restarted server: the sleeper's connection is gone (the call fails, and what it
    may have fetched is suspect), then its script is missing (the fetch behind the BLPOP
    did not run: it says so, None, and loads it), then it fetches again."""
    port, stop, start = own_redis
    server = f"redis://127.0.0.1:{port}/0?namespace=r"
    producer = make(server)

    async def scenario() -> tuple[list[Any] | None, list[Any] | None]:
        c = make(server)
        await c.connect("c1")
        await c.settle_and_fetch([], [], None, [Q], 4)
        assert await c.wait_ready([Q], 4, 0.05) == []  # the sleeper's connection is open
        stop()
        with pytest.raises(BrokerUnavailable):
            await c.wait_ready([Q], 4, 0.05)
        assert c._suspect
        start()  # an empty server: no scripts, no idle registration
        producer.publish(Q, message(5))
        unloaded = await c.wait_ready([Q], 4, 0.05)  # NOSCRIPT: the fetch did not run
        got = await c.wait_ready([Q], 4, 0.05)
        await c.ack(got or [])
        await c.disconnect()
        return unloaded, got

    unloaded, got = run(scenario())
    assert unloaded is None
    assert got is not None and ids(got) == ["id-5"]


def test_a_publish_wakes_every_sleeper_of_its_queue_once(
        make: Callable[..., RedisTransport], ns: str) -> None:
    """Three consumers idle on one queue: a message wakes all three (one of them may be
    registered and busy: the others must not sleep on), each with one token, and takes
    them off the idle set; a second publish before they fetch wakes nobody again."""
    producer = make()
    admin = redis.Redis()

    async def scenario() -> tuple[list[int], list[int]]:
        consumers = [make() for _ in range(3)]
        for i, c in enumerate(consumers):
            await c.connect(f"c{i}")
            assert await c.settle_and_fetch([], [], None, [Q], 4) == []  # short: idle
        producer.publish(Q, message(1))
        one = [int(admin.llen(f"{ns}:wake:c{i}")) for i in range(3)]
        producer.publish_many([Outgoing(Q, message(2)), Outgoing(Q, message(3))])
        two = [int(admin.llen(f"{ns}:wake:c{i}")) for i in range(3)]
        for c in consumers:
            await c.disconnect()
        return one, two

    one, two = run(scenario())
    admin.close()
    assert one == [1, 1, 1]
    assert two == [1, 1, 1]


def test_a_consumer_that_stops_leaves_the_idle_set(
        make: Callable[..., RedisTransport], ns: str) -> None:
    """A stopped consumer is not woken in place of one that sleeps."""
    producer = make()
    admin = redis.Redis()

    async def scenario() -> int:
        gone, asleep = make(), make()
        await gone.connect("gone")
        await asleep.connect("asleep")
        for c in (gone, asleep):
            assert await c.settle_and_fetch([], [], None, [Q], 4) == []  # short: idle
        await gone.disconnect()
        producer.publish(Q, message(1))
        woken = int(admin.llen(f"{ns}:wake:asleep"))
        await asleep.disconnect()
        return woken

    assert run(scenario()) == 1
    assert not admin.exists(f"{ns}:idle:{Q}")
    admin.close()
