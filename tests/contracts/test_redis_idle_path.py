"""The Redis idle path (docs/speed.md, "The round trip, hop by hop"): a caller's ``get()``
reads over a lane, the cursor and the values in one round trip; a pool child settles an
idle worker's message itself (``RedisTransport.settle_here``), one attempt, results first.
Each test uses its own namespace on the shared Redis (or a server of its own)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from celeriac import states
from celeriac.backends.redis import RedisBackend
from celeriac.clients.redis import Connector
from celeriac.clients.redis.lanes import SyncLane, lane_params
from celeriac.compat.redis_broker import KombuRedisTransport
from celeriac.errors import OperationalError
from celeriac.settings import Settings
from celeriac.testing import wait_until
from celeriac.transports.redis import RedisTransport
from tests.contracts import redis_support
from tests.contracts.redis_support import message
from tests.loops import run
from tests.services import require

ns, url, make = redis_support.ns, redis_support.url, redis_support.make
Q = "idle"


@pytest.fixture
def backend(url: str) -> Iterator[RedisBackend]:
    b = RedisBackend(url, Settings(broker_url=url, result_backend=url))
    yield b
    b.close()


def test_a_lane_pipeline_answers_in_order_and_stays_in_step_after_an_error(ns: str) -> None:
    params = lane_params(require("redis"))
    assert params is not None
    lane = SyncLane.open(params, "test", 5.0, 5.0)
    try:
        assert lane.pipeline(("SET", f"{ns}:a", "1"), ("GET", f"{ns}:a"),
                             ("MGET", f"{ns}:a", f"{ns}:none")) == [b"OK", b"1", [b"1", None]]
        with pytest.raises(redis.ResponseError):
            lane.pipeline(("INCR", f"{ns}:a"), ("HGET", f"{ns}:a", "f"), ("GET", f"{ns}:a"))
        # Every reply of the failed pipeline was read: the next call gets its own.
        assert lane.call("GET", f"{ns}:a") == b"2"
        assert not lane.broken
    finally:
        lane.close()


def test_get_of_a_stored_result_is_one_round_trip_over_the_lane(
        backend: RedisBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    backend.store("t0", states.SUCCESS, 0)
    backend.store("t1", states.SUCCESS, 42)
    assert backend.wait_for(["t0"], 5.0)["t0"].result == 0  # the lane is open now
    exchanges: list[int] = []
    real = SyncLane._exchange

    def counted(self: SyncLane, payload: bytes, count: int, spin: bool) -> list[object]:
        exchanges.append(count)
        return real(self, payload, count, spin)

    monkeypatch.setattr(SyncLane, "_exchange", counted)
    monkeypatch.setattr(redis.Redis, "execute_command", None)  # redis-py is not used
    meta = backend.wait_for(["t1"], 5.0)["t1"]
    assert (meta.state, meta.result) == (states.SUCCESS, 42)
    assert exchanges == [2]  # the feed's cursor and the value, in one write


def test_get_that_waits_wakes_on_a_store_and_reads_the_value_with_the_wake(
        backend: RedisBackend, url: str) -> None:
    writer = RedisBackend(url, Settings(broker_url=url, result_backend=url))
    try:
        started = time.monotonic()
        timer = __import__("threading").Timer(0.2, writer.store, ("t2", states.SUCCESS, 7))
        timer.start()
        assert backend.wait_for(["t2"], 10.0)["t2"].result == 7
        assert time.monotonic() - started < 5.0  # woken by the store, not a poll
        timer.join()
    finally:
        writer.close()


def test_settle_here_stores_then_acks_as_the_consumer(
        make: Callable[..., RedisTransport], backend: RedisBackend) -> None:
    consumer, child = make(), make()  # the worker's, and a pool child's own

    async def scenario() -> None:
        await consumer.connect("w1")
        consumer.publish(Q, message(1))
        got = await consumer.settle_and_fetch([], [], None, [Q], 4)
        assert len(got) == 1
        token = consumer.direct_settle(backend)
        assert token == ("w1", backend.conn.endpoint.namespace)
        stored = backend.encode("id-1", states.SUCCESS, "done")
        child.settle_here((*token, got[0].tag), stored)
        assert backend.get("id-1").result == "done"  # type: ignore[union-attr]
        consumer.settled_elsewhere(got)
        # Nothing is ours any more: a fetch gives nothing back, a disconnect returns none.
        client = redis.Redis.from_url(require("redis"))
        ns = backend.conn.endpoint.namespace
        assert client.scard(f"{ns}:owned:w1") == 0
        client.close()
        # The worker settling it again (a child whose report said otherwise) is harmless.
        await consumer.settle_and_fetch(got, [stored], ns, [], 0)
        await consumer.disconnect()

    run(scenario())


def test_direct_settle_needs_the_results_on_the_brokers_server_and_our_settling(
        make: Callable[..., RedisTransport], url: str, ns: str) -> None:
    t = make()

    async def scenario() -> None:
        await t.connect("w2")
        other_db = require("redis").rsplit("/", 1)[0] + "/14"
        elsewhere = RedisBackend(f"{other_db}?namespace={ns}", Settings(broker_url=url))
        assert t.direct_settle(elsewhere) is None
        elsewhere.close()
        kombu_url = other_db + "?layout=kombu"
        kombu = KombuRedisTransport(kombu_url, Settings(broker_url=kombu_url))
        kombu.consumer_id = "w2"
        same = RedisBackend(f"{other_db}?namespace={ns}", Settings(broker_url=url))
        assert kombu.direct_settle(same) is None  # it settles in a layout of its own
        same.close()
        kombu.close()
        tls = f"rediss://127.0.0.1:6379/0?namespace={ns}"
        secure = RedisTransport(tls, Settings(broker_url=tls))
        secure.consumer_id = "w2"
        its = RedisBackend(tls, Settings(broker_url=tls, result_backend=tls))
        assert secure.direct_settle(its) is None  # no lane over TLS: the worker settles
        its.close()
        secure.close()
        await t.disconnect()

    run(scenario())


@pytest.fixture
def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_run_once_raises_at_once_without_retries(dead_port: int, tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{dead_port}/0"
    conn = Connector([url], Settings(broker_url=url, broker_connection_max_retries=100),
                     "broker", read_timeout=1.0)
    started = time.monotonic()
    with pytest.raises(OperationalError):
        conn.run_once("settle_and_fetch", ["w", 1000, 0, "", 0, 0, 10])
    assert time.monotonic() - started < 5.0  # no backoff between 100 retries
    # And once the server is there, the same connector succeeds (a fresh lane).
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed")
    server = subprocess.Popen([exe, "--port", str(dead_port), "--bind", "127.0.0.1", "--save",
                               "", "--appendonly", "no", "--dir", str(tmp_path)],
                              stdout=subprocess.DEVNULL)
    try:
        def up() -> bool:
            try:
                socket.create_connection(("127.0.0.1", dead_port), 0.1).close()
                return True
            except OSError:
                return False

        wait_until(up, 10, 0.02, message="redis-server started")
        assert conn.run_once("settle_and_fetch", ["w", 1000, 0, "", 0, 0, 10]) == [-1]
    finally:
        conn.close()
        server.kill()
        server.wait(10)
