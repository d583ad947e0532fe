"""The Redis hot paths: lanes (``celeriac.clients.redis.lanes``) and the worker's exchange script.

A lane is a lean connection for scripts; the exchange stores results in the result
backend's layout, acks and fetches in one round trip. Each test uses its own namespace on
the shared Redis and deletes its keys after.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest
import redis
import uvloop

from celeriac import states
from celeriac.backends.redis import RedisBackend
from celeriac.clients.redis import Connector, lanes
from celeriac.clients.redis.lanes import AsyncLane, SyncLane, lane_params
from celeriac.errors import BrokerUnavailable
from celeriac.settings import Settings
from celeriac.transports.base import Outgoing
from celeriac.transports.redis import RedisTransport
from tests.contracts import redis_support
from tests.contracts.redis_support import ids, message
from tests.loops import run
from tests.services import require

# The shared fixtures: a namespace of the test's own, its URL, transports made in it.
ns, url, make = redis_support.ns, redis_support.url, redis_support.make

T = TypeVar("T")
Q = "lanes"


@pytest.fixture(autouse=True)
def own_callers(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """The threads whose lane calls this test's lanes take into account (``_shared``):
    the test's own, and any it adds. ``lanes._Callers`` is process-wide, so a thread an
    earlier test left behind, calling a lane now and then, would otherwise keep this
    test's lanes from spinning, or not, by its timing alone."""
    monkeypatch.setattr(lanes._Callers, "last", 0)
    monkeypatch.setattr(lanes._Callers, "at", 0.0)
    monkeypatch.setattr(lanes._Callers, "shared_until", 0.0)
    ours = {threading.get_ident()}
    shared = lanes._shared
    monkeypatch.setattr(lanes, "_shared",
                        lambda now: threading.get_ident() in ours and shared(now))
    return ours


def count_calls(lane: Any) -> list[str]:
    """Record the name of every command ``lane`` sends from now on."""
    sent: list[str] = []
    real = lane.call

    def counting(*args: Any) -> Any:
        sent.append(str(args[0]))
        return real(*args)

    lane.call = counting
    return sent


def on_both_loops(scenario: Callable[[], Coroutine[Any, Any, T]]) -> list[T]:
    """Run ``scenario`` on asyncio's loop and on uvloop's (the worker's): their transports
    differ (uvloop's do not subclass asyncio's)."""
    return [asyncio.run(scenario()), uvloop.run(scenario())]


# -- lanes ----------------------------------------------------------------------------------

def test_sync_lane_runs_scripts_and_reloads_them_after_a_flush(url: str) -> None:
    conn = Connector([url], Settings(broker_url=url), "broker", read_timeout=4.0)
    try:
        assert conn.run("purge", [Q]) == 0
        lane = conn._sync_lane()
        assert isinstance(lane, SyncLane)
        sent = count_calls(lane)
        redis.Redis().script_flush()  # as a restarted server would have forgotten them
        assert conn.run("purge", [Q]) == 0
        assert sent == ["EVALSHA", "SCRIPT", "EVALSHA"]
        with pytest.raises(redis.ResponseError):
            lane.call("GET")  # wrong number of arguments: an error reply, not a crash
        assert lane.call("PING") == b"PONG"  # the connection is still in step
    finally:
        conn.close()


def test_sync_lane_redials_after_the_server_drops_it(url: str) -> None:
    conn = Connector([url], Settings(broker_url=url), "broker", read_timeout=4.0)
    try:
        conn.run("purge", [Q])
        first = conn._sync_lane()
        assert first is not None
        redis.Redis().client_kill_filter(_id=first.call("CLIENT", "ID"))
        assert conn.run("purge", [Q]) == 0  # retried on a new connection
        assert first.broken and conn._sync_lane() is not first
    finally:
        conn.close()


class ScriptedServer:
    """A stand-in for a Redis that is slow or silent on cue (the shared server must not be
    stalled for other tests): answers CLIENT SETNAME and PING at once, ``SLOW`` after
    50 ms, and ``HANG`` never."""

    def __init__(self, hang_on: bytes = b"HANG") -> None:
        self.hang_on = hang_on
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:  # one connection at a time, until the listener is closed
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(conn)
            with contextlib.suppress(OSError):
                while data := conn.recv(1 << 16):
                    if self.hang_on in data:
                        break  # silent from now on; the connection stays open
                    if b"SLOW" in data:
                        time.sleep(0.05)  # sleep-ok: the slow reply the test is about
                    if b"LOADME" in data:  # a restarted server still reading its dataset
                        conn.sendall(b"-LOADING Redis is loading the dataset in memory\r\n")
                        continue
                    conn.sendall(b"+PONG\r\n" if b"PING" in data else b"+OK\r\n")

    def lane(self, read_timeout: float) -> SyncLane:
        return SyncLane.open({"host": "127.0.0.1", "port": self.port}, "test", 2.0,
                             read_timeout)

    def close(self) -> None:
        # shutdown() wakes the server thread's accept() or recv(); close() alone would not.
        for sock in (self.listener, *self.conns):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self.thread.join(timeout=2)


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    made = ScriptedServer()
    yield made
    made.close()


def test_sync_lane_stops_spinning_for_a_slow_server_and_tries_again_later(
        server: ScriptedServer) -> None:
    lane = server.lane(read_timeout=4.0)
    try:
        assert lane.call("PING") == b"PONG"
        lane._misses = 0  # whatever the handshake's replies were
        for _ in range(lanes.SPIN_MISSES):
            assert lane.call("SLOW") == b"OK"  # the spin gives up; recv waits for it
        # That many replies in a row missed: the next calls sleep in recv at once (a
        # remote or busy server costs no spinning), then the lane spins again.
        assert lane._resting == lanes.SPIN_REST
        for _ in range(lanes.SPIN_REST):
            assert lane.call("PING") == b"PONG"
        assert lane._resting == 0
        assert lane.call("SLOW") == b"OK" and lane._misses == 1
    finally:
        lane.close()


def test_a_spinning_lane_gives_its_cpu_way_between_polls(
        server: ScriptedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # On 2 CPUs a spin that never yields keeps Redis (whose reply it waits for) or a pool
    # child off its CPU: it must let any runnable process go first (docs/speed.md).
    yields: list[int] = []
    monkeypatch.setattr(lanes.os, "sched_yield", lambda: yields.append(1))
    lane = server.lane(read_timeout=4.0)
    try:
        lane._misses = 0
        yields.clear()  # the handshake's
        assert lane.call("SLOW") == b"OK"  # 50 ms: the whole spin polls in vain
        assert yields and lane._misses == 1
    finally:
        lane.close()


def test_lanes_do_not_spin_while_threads_take_turns(
        server: ScriptedServer, url: str, monkeypatch: pytest.MonkeyPatch,
        own_callers: set[int]) -> None:
    # A spinning thread holds the CPU and the GIL its process's other threads need (four
    # paced producer threads: 135-147 us of CPU a delay() spinning, 114-117 us without).
    yields: list[int] = []
    monkeypatch.setattr(lanes.os, "sched_yield", lambda: yields.append(1))
    monkeypatch.setattr(lanes, "SHARED_WINDOW", 30.0)  # longer than this test, loaded
    mine = server.lane(read_timeout=4.0)
    try:
        mine._misses = 0
        yields.clear()
        assert mine.call("SLOW") == b"OK"
        assert yields and mine._misses == 1  # alone: it spun (in vain, 50 ms)

        def other_thread() -> None:  # a call on a lane of its own, to the real Redis
            own_callers.add(threading.get_ident())
            params = lane_params(url)
            assert params is not None
            lane = SyncLane.open(params, "test", 2.0, 4.0)
            assert lane.call("PING") == b"PONG"
            lane.close()

        other = threading.Thread(target=other_thread)
        other.start()
        other.join()
        mine._misses = 0
        yields.clear()
        assert mine.call("SLOW") == b"OK"
        assert not yields and mine._misses == 0  # threads take turns: it blocked at once
        # Alone for a whole window since, a thread spins again.
        assert not lanes._shared(time.perf_counter() + 2 * lanes.SHARED_WINDOW)
    finally:
        mine.close()


def test_a_server_still_loading_its_dataset_is_a_connection_error_retried(
        server: ScriptedServer) -> None:
    """LOADING (a Redis just restarted) is what redis-py makes it, BusyLoadingError, a
    ConnectionError the connector retries, not a reply error that fails the call."""
    from celeriac.clients.redis.connector import RETRYABLE

    lane = server.lane(2.0)
    try:
        with pytest.raises(redis.exceptions.BusyLoadingError) as caught:
            lane.call("LOADME")
        assert isinstance(caught.value, RETRYABLE)
        assert lane.call("PING") == b"PONG"  # the stream stays in step
    finally:
        lane.close()


def test_sync_lane_read_timeout_drops_the_connection(server: ScriptedServer) -> None:
    # The read timeout is kept by the kernel (SO_RCVTIMEO): it must still end the wait.
    lane = server.lane(read_timeout=0.2)
    try:
        started = time.monotonic()
        with pytest.raises(redis.TimeoutError, match="no reply in time"):
            lane.call("HANG")
        assert 0.15 < time.monotonic() - started < 2.0
        assert lane.broken  # a late reply would be out of step
        with pytest.raises(redis.ConnectionError):
            lane.call("PING")
    finally:
        lane.close()


def test_a_script_call_that_gets_no_reply_times_out_and_fails_over() -> None:
    # A server that keeps the connection but never answers a script: the worker's pump
    # and its lease renewals go through this call, so it must end (and be retried on a
    # new connection, then reported), never wait forever.
    server = ScriptedServer(hang_on=b"EVALSHA")
    url = f"redis://127.0.0.1:{server.port}/0"
    conn = Connector([url], Settings(broker_url=url, broker_connection_timeout=0.3), "broker",
                     read_timeout=0.3)

    async def call() -> float:
        started = time.monotonic()
        try:
            with pytest.raises(BrokerUnavailable, match=r"no reply to purge within 0\.3s"):
                await conn.arun("purge", [Q])
            return time.monotonic() - started
        finally:
            await conn.aclose()

    try:
        took = run(call())
        assert 0.5 < took < 3.0  # two attempts of 0.3 s each, not forever
    finally:
        conn.close()
        server.close()


def test_sync_lane_reads_a_reply_larger_than_its_buffer(url: str, ns: str) -> None:
    params = lane_params(url.split("?")[0])
    assert params is not None
    lane = SyncLane.open(params, "test-big", 2.0, 4.0)
    key = f"{ns}:big"
    try:
        value = bytes(range(256)) * 4096  # 1 MiB: many reads, the first one spun for
        assert lane.call("SET", key, value) == b"OK"
        assert lane.call("GET", key) == value
        assert lane.call("DEL", key) == 1
    finally:
        lane.close()


def test_async_lane_keeps_overlapping_replies_in_order(url: str) -> None:
    params = lane_params(url.split("?")[0])
    assert params is not None

    async def scenario() -> list[Any]:
        lane = await AsyncLane.open(params, "test", 4.0)
        try:
            futures = [lane.call("ECHO", f"n{i}") for i in range(200)]
            return list(await asyncio.gather(*futures))
        finally:
            lane.close()

    for replies in on_both_loops(scenario):
        assert replies == [f"n{i}".encode() for i in range(200)]


def test_async_lane_errors_are_redis_errors_and_a_drop_is_redialled(url: str) -> None:
    async def scenario() -> None:
        conn = Connector([url], Settings(broker_url=url), "broker", read_timeout=4.0)
        try:
            assert await conn.arun("purge", [Q]) == 0
            lane = await conn._async_lane()
            assert lane is not None
            with pytest.raises(redis.ResponseError):
                await lane.call("GET")
            redis.Redis().client_kill_filter(_id=await lane.call("CLIENT", "ID"))
            assert await conn.arun("purge", [Q]) == 0  # redialled once, transparently
            assert lane.broken and await conn._async_lane() is not lane
            redis.Redis().script_flush()
            assert await conn.arun("purge", [Q]) == 0  # NOSCRIPT: loaded again
        finally:
            await conn.aclose()

    on_both_loops(scenario)


def test_tls_urls_keep_redis_py() -> None:
    assert lane_params("rediss://127.0.0.1:6379/0") is None
    unix = lane_params("unix:///tmp/redis.sock?db=2")
    assert unix is not None and (unix["path"], unix["db"]) == ("/tmp/redis.sock", 2)


# -- the exchange -------------------------------------------------------------------------

def test_exchange_stores_acks_and_fetches_in_one_round_trip(
        make: Callable[..., RedisTransport], url: str) -> None:
    producer = make()
    producer.publish_many([Outgoing(Q, message(n)) for n in range(10)])
    backend = RedisBackend(url, Settings(broker_url=url, result_expires=60))

    async def scenario() -> None:
        c = make()
        await c.connect("c1")
        namespace = c.results_namespace(backend)
        assert namespace == backend.conn.endpoint.namespace
        first = await c.settle_and_fetch([], [], namespace, [Q], 4)
        assert ids(first) == ["id-0", "id-1", "id-2", "id-3"]
        results = [backend.encode(d.message.headers["id"], states.SUCCESS, i)
                   for i, d in enumerate(first)]
        lane = await c.conn._async_lane()
        sent = count_calls(lane)
        second = await c.settle_and_fetch(first, results, namespace, [Q], 4)
        assert sent == ["EVALSHA"]
        assert ids(second) == ["id-4", "id-5", "id-6", "id-7"]
        # Settling only: no fetch, no lease business.
        assert await c.settle_and_fetch(second, [], namespace, [Q], 0) == []
        assert await c.settle_and_fetch([], [], namespace, [Q], 0) == []
        assert sent == ["EVALSHA", "EVALSHA"]
        await c.disconnect()

    run(scenario())
    got = backend.wait_for([f"id-{n}" for n in range(4)], 1.0)  # the change feed has them
    assert {k: m.result for k, m in got.items()} == {f"id-{n}": n for n in range(4)}
    assert all(m.state == states.SUCCESS for m in got.values())
    assert backend.cleanup() == 0  # indexed for expiry, none expired yet
    assert producer.queue_length(Q) == 2  # id-8, id-9; the rest acked
    backend.close()


def test_exchange_acks_only_what_the_consumer_still_owns(
        make: Callable[..., RedisTransport], ns: str) -> None:
    producer = make()
    producer.publish_many([Outgoing(Q, message(n)) for n in range(2)])

    async def scenario() -> None:
        slow = make(worker_lease_timeout=0.2)
        await slow.connect("slow")
        taken = await slow.fetch([Q], 2, 1.0)
        other = make(worker_lease_timeout=0.2)
        await other.connect("other")
        await asyncio.sleep(0.25)  # sleep-ok: the 0.2 s lease must run out
        assert await other.renew_lease() == 2
        again = await other.fetch([Q], 2, 1.0)
        assert ids(again) == ids(taken)
        # The slow consumer's late ack must not delete what the other one now runs.
        await slow.settle_and_fetch(taken, [], None, [Q], 0)
        admin = redis.Redis()
        assert admin.exists(*[f"{ns}:m:{d.tag}" for d in again]) == 2
        assert await other.settle_and_fetch(again, [], None, [Q], 0) == []
        assert admin.exists(*[f"{ns}:m:{d.tag}" for d in again]) == 0
        admin.close()
        await other.disconnect()

    run(scenario())
    assert producer.queue_length(Q) == 0


def test_results_go_through_the_backend_when_it_lives_elsewhere(url: str, ns: str) -> None:
    t = RedisTransport(url, Settings(broker_url=url))
    t.consumer_id = "c1"
    elsewhere = f"{require('redis').rsplit('/', 1)[0]}/1?namespace={ns}"
    try:
        assert t.results_namespace(RedisBackend(elsewhere, Settings())) is None
        same = RedisBackend(f"{url.split('?')[0]}?namespace={ns}r", Settings())
        assert t.results_namespace(same) == f"{ns}r"
        with pytest.raises(ValueError):
            asyncio.run(t.settle_and_fetch([], [same.encode("x", states.SUCCESS, 1)], None, [Q], 0))
    finally:
        t.close()
