"""Lean RESP connections ("lanes") for the Redis hot paths: scripts, nothing else.

redis-py spends tens of microseconds of Python on each command (connection pool, retry
wrapper, observability hooks; its asyncio client packs every argument in Python), more
than a round trip to a local Redis costs. A producer's publish and the worker's settle_and_fetch
pay that on every call, so their scripts go through a lane instead: the command packed
by hiredis, written to one socket, the reply parsed by hiredis. Everything else
(BLPOP, pub/sub, administration) stays on redis-py.

A blocking lane waits for its reply by spinning first (``SyncLane.call``): a local Redis
answers a script in 20-40 us, and a thread that blocks in ``recv`` instead pays the
scheduler's wake-up on top, which measured 45-50 us more per round trip on a 2-vCPU
virtual machine (a PING round trip: 68 us blocking, 22 us spinning). The spin is bounded
(``SPIN_SECONDS``) and adaptive: after ``SPIN_MISSES`` replies in a row that it did not
catch (a remote or busy server), the lane blocks straight away for ``SPIN_REST`` calls
before it tries again, so a far server costs a few wasted spins in a thousand calls.
The spin also yields its CPU between polls (``sched_yield``): on an idle machine that
returns at once, but where another process is runnable on the same CPU (Redis, whose
reply we wait for, or a worker's pool child) it runs first. On 2 CPUs, a worker, Redis
and four producer threads at 2,600-2,900 tasks/s: p99 from ``delay()`` to the task's
start 4.3-8.6 ms with the yield, 6.3-152 ms without (docs/speed.md, "Latency under load").
Where the calls come from several threads taking turns, no lane spins (``_shared``): a
spinning thread holds the CPU its process's other threads need, and each of its polls
and yields hands the GIL to them and waits to get it back. Four producer threads paced
at 2,800/s beside a worker spent 135-147 us of CPU a ``delay()`` with the spin, 114-122
us without.

Lanes serve ``redis://`` and ``unix://`` URLs; ``rediss://`` keeps redis-py (TLS has too
many options to copy). Failures raise redis-py's exception types, so ``connector.Connector``
retries and fails over alike: a lost or timed-out connection is ``redis.ConnectionError``
or ``redis.TimeoutError`` and the lane is dropped; an error reply is
``redis.ResponseError`` (``NoScriptError``, ``ReadOnlyError`` where they apply).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import os
import socket
import struct
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any, cast

import hiredis
import redis
from redis.connection import SSLConnection, parse_url

_BUFFER = 1 << 16
SPIN_SECONDS = 100e-6
"""The longest a blocking lane spins for a reply before it sleeps in ``recv``."""
SPIN_MISSES = 4
"""Replies in a row not caught by the spin before the lane stops spinning..."""
SPIN_REST = 256
"""...for this many calls."""
SHARED_WINDOW = 0.01
"""Seconds after two threads of a process called within this time of each other during
which no lane spins (``_shared``)."""


class _Callers:
    """Which thread called a blocking lane last, and when: enough to tell a process whose
    calls come from one thread from one whose threads take turns. Updated without a
    lock: a lost update only moves a heuristic's window."""

    last = 0
    at = 0.0
    shared_until = 0.0


def _shared(now: float) -> bool:
    """Whether another thread of this process called a lane in the last
    ``SHARED_WINDOW`` (or until such a call is that old): then a lane blocks at once."""
    me = threading.get_ident()
    if _Callers.last != me:
        if now - _Callers.at < SHARED_WINDOW:
            _Callers.shared_until = now + SHARED_WINDOW
        _Callers.last = me
    _Callers.at = now
    return now < _Callers.shared_until


def lane_params(url: str) -> dict[str, Any] | None:
    """Connection parameters for a lane to ``url`` (redis-py's parse), or None where only
    redis-py will do (TLS)."""
    params: dict[str, Any] = parse_url(url)  # type: ignore[no-untyped-call]
    if params.get("connection_class") is SSLConnection:
        return None
    return params


def sha1(source: str) -> str:
    return hashlib.sha1(source.encode()).hexdigest()


def _handshake(params: dict[str, Any], name: str) -> list[tuple[Any, ...]]:
    commands: list[tuple[Any, ...]] = []
    password = params.get("password")
    if password is not None:
        user = params.get("username")
        commands.append(("AUTH", user, password) if user else ("AUTH", password))
    if params.get("db"):
        commands.append(("SELECT", params["db"]))
    commands.append(("CLIENT", "SETNAME", name))
    return commands


def _reply_error(reply: hiredis.ReplyError) -> redis.RedisError:
    text = str(reply)
    if text.startswith("NOSCRIPT"):
        return redis.exceptions.NoScriptError(text)
    if text.startswith("READONLY"):
        return redis.ReadOnlyError(text)
    if text.startswith("LOADING"):
        # A restarted server reading its dataset: a ConnectionError, retried as one.
        return redis.exceptions.BusyLoadingError(text)
    if text.startswith(("NOAUTH", "WRONGPASS")):
        return redis.AuthenticationError(text)
    return redis.ResponseError(text)


class SyncLane:
    """A blocking connection for one thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        # A lane of a connector never closed (an app dropped without ``close()``) closes
        # its socket as it goes, as a redis-py connection does. The finalizer holds the
        # socket: a cycle's collection cannot reach the socket first (a ResourceWarning).
        weakref.finalize(self, sock.close)
        self.reader = hiredis.Reader()
        self.buffer = bytearray(_BUFFER)
        self.broken = False
        self.thread = threading.current_thread()
        self._misses = 0
        """Replies in a row the spin did not catch."""
        self._resting = 0
        """Calls left that block without spinning."""
        self.spin = True
        """False: block at once (other threads of this process need the CPU the spin
        would take: a producer's group commit, ``Connector.crowded``)."""

    @classmethod
    def open(cls, params: dict[str, Any], name: str, connect_timeout: float,
             read_timeout: float | None) -> SyncLane:
        try:
            if "path" in params:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(connect_timeout)
                sock.connect(params["path"])
            else:
                sock = socket.create_connection(
                    (params.get("host", "localhost"), params.get("port", 6379)),
                    timeout=connect_timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            # Blocking at Python's level, with the read timeout kept by the kernel
            # (SO_RCVTIMEO, SO_SNDTIMEO): a Python-level timeout would poll() before
            # every recv, and the spin needs a recv that returns at once.
            sock.settimeout(None)
            if read_timeout:
                timeval = struct.pack("ll", int(read_timeout),
                                      int(read_timeout % 1 * 1_000_000))
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
        except TimeoutError as exc:
            raise redis.TimeoutError(f"connecting: {exc}") from exc
        except OSError as exc:
            raise redis.ConnectionError(f"connecting: {exc}") from exc
        lane = cls(sock)
        for command in _handshake(params, name):
            lane.call(*command)
        return lane

    def call(self, *args: Any) -> Any:
        reply = self._exchange(hiredis.pack_command(args), 1, self.spin)[0]
        if isinstance(reply, hiredis.ReplyError):
            raise _reply_error(reply)
        return reply

    def pipeline(self, *commands: Sequence[Any], spin: bool = False) -> list[Any]:
        """``commands`` in one write, their replies in order (an error reply raised once
        all have been read, so the stream stays in step). ``spin``: as ``call`` does; off
        by default, for a caller whose reply takes a while (a blocking read)."""
        replies = self._exchange(b"".join(hiredis.pack_command(tuple(c)) for c in commands),
                                 len(commands), spin)
        for reply in replies:
            if isinstance(reply, hiredis.ReplyError):
                raise _reply_error(reply)
        return replies

    def _exchange(self, payload: bytes, count: int, spin: bool) -> list[Any]:
        """Send ``payload`` (``count`` commands), read their ``count`` replies."""
        if self.broken:
            raise redis.ConnectionError("connection closed")
        reader = self.reader
        replies: list[Any] = []
        try:
            self.sock.sendall(payload)
            now = time.perf_counter() if spin else 0.0
            if not spin or _shared(now):
                n = 0
            elif self._resting:
                self._resting -= 1
                n = 0
            else:
                n = self._spin(now)
            while True:
                if n == 0:
                    n = self.sock.recv_into(self.buffer)
                    if not n:
                        raise ConnectionResetError("closed by the server")
                reader.feed(self.buffer, 0, n)  # type: ignore[arg-type]
                while (reply := reader.gets()) is not False:
                    replies.append(reply)
                if len(replies) >= count:
                    return replies
                n = 0
        except (TimeoutError, BlockingIOError) as exc:
            # BlockingIOError: SO_RCVTIMEO or SO_SNDTIMEO ran out.
            # A reply may still come: the stream is out of step, so drop it.
            self.close()
            raise redis.TimeoutError(f"no reply in time: {exc}") from exc
        except OSError as exc:
            self.close()
            raise redis.ConnectionError(str(exc) or type(exc).__name__) from exc

    def _spin(self, now: float) -> int:
        """Bytes of the reply read while spinning from ``now`` (0: none came within
        SPIN_SECONDS)."""
        recv_into, buffer, pause = self.sock.recv_into, self.buffer, os.sched_yield
        end = now + SPIN_SECONDS
        while True:
            try:
                n = recv_into(buffer, 0, socket.MSG_DONTWAIT)
            except BlockingIOError:
                if time.perf_counter() < end:
                    pause()  # a runnable process on this CPU (Redis?) goes first
                    continue
                self._misses += 1
                if self._misses == SPIN_MISSES:
                    self._misses, self._resting = 0, SPIN_REST
                return 0
            if not n:
                raise ConnectionResetError("closed by the server")
            self._misses = 0
            return n

    def evalsha(self, sha: str, source: str, args: Sequence[Any]) -> Any:
        try:
            return self.call("EVALSHA", sha, 0, *args)
        except redis.exceptions.NoScriptError:
            self.call("SCRIPT", "LOAD", source)  # a restarted or flushed server
            return self.call("EVALSHA", sha, 0, *args)

    def close(self) -> None:
        self.broken = True
        self.sock.close()


class AsyncLane(asyncio.Protocol):
    """A connection on one event loop; calls may overlap (replies come in order)."""

    def __init__(self) -> None:
        self.reader = hiredis.Reader()
        self.waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.transport: asyncio.Transport | None = None
        self.broken = False

    @classmethod
    async def open(cls, params: dict[str, Any], name: str, timeout: float) -> AsyncLane:
        loop = asyncio.get_running_loop()
        lane = cls()
        try:
            async with asyncio.timeout(timeout):
                if "path" in params:
                    await loop.create_unix_connection(lambda: lane, params["path"])
                else:
                    await loop.create_connection(
                        lambda: lane, params.get("host", "localhost"), params.get("port", 6379))
                for command in _handshake(params, name):
                    await lane.call(*command)
        except TimeoutError as exc:
            lane.close()
            raise redis.TimeoutError(f"connecting: {exc}") from exc
        except OSError as exc:
            lane.close()
            raise redis.ConnectionError(f"connecting: {exc}") from exc
        return lane

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport; they have its methods.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        reader.feed(data)
        while (reply := reader.gets()) is not False:
            if not self.waiting:
                self.close()  # a reply for nobody: the stream is out of step
                return
            future = self.waiting.popleft()
            if future.cancelled():
                continue  # its caller gave up; the reply still keeps the order
            if isinstance(reply, hiredis.ReplyError):
                future.set_exception(_reply_error(reply))
            else:
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.broken = True
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(redis.ConnectionError(
                    f"connection lost: {exc}" if exc else "connection closed"))

    def call(self, *args: Any) -> asyncio.Future[Any]:
        """Send one command; the future is its reply."""
        if self.broken or self.transport is None:
            raise redis.ConnectionError("connection closed")
        future = asyncio.get_running_loop().create_future()
        self.waiting.append(future)
        self.transport.write(hiredis.pack_command(args))
        return future

    def pipeline(self, *commands: Sequence[Any]) -> list[asyncio.Future[Any]]:
        """Send ``commands`` in one write; the futures of their replies, in order."""
        if self.broken or self.transport is None:
            raise redis.ConnectionError("connection closed")
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in commands]
        self.waiting.extend(futures)
        self.transport.write(b"".join(hiredis.pack_command(tuple(c)) for c in commands))
        return futures

    async def evalsha(self, sha: str, source: str, args: Sequence[Any]) -> Any:
        try:
            return await self.call("EVALSHA", sha, 0, *args)
        except redis.exceptions.NoScriptError:
            await self.call("SCRIPT", "LOAD", source)
            return await self.call("EVALSHA", sha, 0, *args)

    def close(self) -> None:
        self.broken = True
        if self.transport is not None:
            self.transport.close()
