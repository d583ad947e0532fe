"""What the Redis transport and the Redis result backend share: URLs, clients, retries,
and the Lua scripts.

A URL is redis-py's (``redis://[user:password@]host:port/db``, ``rediss://`` for TLS) plus
our own query parameter ``namespace`` (default ``celeriac``), the prefix of every key;
it is taken out before the URL reaches redis-py. Several URLs separated by ``;`` are
tried in order (``broker_failover_strategy="round-robin"``) or in a shuffled order
(``"shuffle"``): a connection failure moves to the next one. Behind Sentinel
(``topology.py``) a connection failure or READONLY forgets the master, the next attempt
asks the sentinels again, and NOSCRIPT on the new master loads the scripts again.

Clients belong to one process (re-created when ``os.getpid()`` changes, never closed
in a child) and async clients to one event loop. redis-py's own retries are off: the
policy is ours. Synchronous calls (producers, administration, results) retry per
``broker_connection_retry`` / ``broker_connection_max_retries`` with exponential backoff
and jitter, then raise ``BrokerUnavailable``. Async calls (the worker) reconnect and try
once more, then raise: the worker's Consumer owns the longer backoff. A retried call
may have run once already (its reply was lost): that is at-least-once, and the
transport's scripts are written so that a repeat does no harm.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import random
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript, Script
from redis.retry import Retry

from ...errors import BrokerUnavailable, ConfigurationError, OperationalError
from ..net import backoff, retry_policy
from .lanes import AsyncLane, SyncLane, lane_params
from .scripts import NotReplicated, check_wait, script_sha, script_source
from .topology import (
    DEFAULT_NAMESPACE,
    DRIVER,
    Endpoint,
    adiscover,
    discover,
    parse,
    parse_url,
    where,
)

if TYPE_CHECKING:
    from ...settings import Settings

__all__ = ["DEFAULT_NAMESPACE", "Connector", "Endpoint", "parse_url", "script_sha",
           "script_source"]  # the first and the last three lived here before
logger = logging.getLogger("celeriac.redis")

T = TypeVar("T")
FAILOVER_STRATEGIES = ("round-robin", "shuffle")
# Worth another try (on the next URL, if there are several). READONLY means this URL now
# points at a replica: after a failover the primary is elsewhere.
RETRYABLE = (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError, TimeoutError)
_SPIN: contextvars.ContextVar[bool] = contextvars.ContextVar("celeriac_redis_spin", default=True)
"""Whether a lane spins for its reply in this thread (``Connector.crowded``)."""


def transport_options(urls: Sequence[str], settings: Settings) -> Mapping[str, Any]:
    """The transport options of the setting ``urls`` come from: a store on the broker's
    Redis (the shared store: revoked ids, leases, beat) follows the broker's sentinel
    master name and key prefix as the transport does."""
    pieces = {u.strip() for u in urls if u.strip()}
    if pieces & {u.strip() for u in settings.broker_url.split(";")}:
        return settings.broker_transport_options or {}
    if pieces & {u.strip() for u in (settings.result_backend or "").split(";")}:
        return settings.result_backend_transport_options or {}
    return {}


class Connector:
    """The URLs of one broker or result store, the current one, and this process's
    clients for it."""

    def __init__(self, urls: Sequence[str], settings: Settings, role: str, *,
                 read_timeout: float | None, options: Mapping[str, Any] | None = None) -> None:
        if settings.broker_failover_strategy not in FAILOVER_STRATEGIES:
            raise ConfigurationError(
                f"broker_failover_strategy must be one of {', '.join(FAILOVER_STRATEGIES)}; "
                f"got {settings.broker_failover_strategy!r}")
        if options is None:
            options = transport_options(urls, settings)
        self.endpoints, self.durability = parse(urls, options, role)
        if self.endpoints[0].cluster:
            raise ConfigurationError(
                f"{self.endpoints[0].safe!r} is a Redis Cluster: the {role} has no Cluster "
                f"client here")
        if settings.broker_failover_strategy == "shuffle":
            random.shuffle(self.endpoints)
        self.settings = settings
        self.role = role
        self.read_timeout = read_timeout
        self.async_failures = 0
        """Connection errors seen by async calls (a caller can tell that a reply was lost)."""
        self._current = 0
        self._gen = 0
        """Bumped whenever the server to talk to changes (failover): clients and lanes made
        for an older generation are replaced."""
        self._masters: dict[int, str] = {}
        """Behind sentinels: endpoint index -> the master's URL they gave (until it fails)."""
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._client: tuple[int, redis.Redis, dict[str, Script]] | None = None
        self._aclient: tuple[int, asyncio.AbstractEventLoop, aredis.Redis,
                             dict[str, AsyncScript]] | None = None
        self._stale: list[aredis.Redis] = []
        # Lanes (``lanes.py``): scripts bypass redis-py. Per thread (sync) and per event loop
        # (async), for the current endpoint; None where only redis-py will do.
        self._params: tuple[int, dict[str, Any] | None] | None = None
        self._lanes = threading.local()
        self._all_lanes: list[SyncLane] = []
        self._alane: tuple[int, asyncio.AbstractEventLoop, asyncio.Future[AsyncLane]] | None = None

    @property
    def endpoint(self) -> Endpoint:
        return self.endpoints[self._current]

    def _options(self) -> dict[str, Any]:
        # The name makes CLIENT LIST show which namespace and role a connection serves.
        name = f"celeriac-{self.role}:{self.endpoint.namespace}"
        return {
            "socket_connect_timeout": self.settings.broker_connection_timeout,
            "socket_keepalive": True,
            "client_name": re.sub(r"[^!-~]", "-", name),  # printable, no spaces
            **DRIVER,
        }

    def _url(self) -> str:
        """The current server's URL for redis-py; behind sentinels, asks them first unless
        it knows the master (``redis.ConnectionError`` when none of them can say)."""
        endpoint = self.endpoint
        if endpoint.sentinels is None:
            return endpoint.url
        url = self._masters.get(self._current)
        if url is None:
            url = discover(endpoint, self.settings.broker_connection_timeout)
            self._found(url)
        return url

    async def _aresolve(self) -> None:
        if self.endpoint.sentinels is not None and self._current not in self._masters:
            self._found(await adiscover(self.endpoint, self.settings.broker_connection_timeout))

    def _found(self, url: str) -> None:
        self._masters[self._current] = url
        logger.info("Redis (%s): the sentinels name %s as the master", self.role, where(url))

    def _lane_params(self) -> dict[str, Any] | None:
        held = self._params
        if held is None or held[0] != self._gen:
            held = self._params = (self._gen, lane_params(self._url()))
        return held[1]

    def _check_pid(self) -> None:
        if self._pid != os.getpid():
            # The parent's sockets belong to the parent: forget them, never close them.
            self._client = self._aclient = None
            self._params = None
            self._stale = []
            self._lock = threading.Lock()
            self._lanes = threading.local()
            self._all_lanes = []
            self._alane = None
            self._pid = os.getpid()

    # -- synchronous ----------------------------------------------------------------------
    def _sync(self) -> tuple[redis.Redis, dict[str, Script]]:
        self._check_pid()
        current = self._client
        if current is None or current[0] != self._gen:
            gen, url = self._gen, self._url()
            with self._lock:
                current = self._client
                if current is None or current[0] != gen:
                    client = redis.Redis.from_url(
                        url, socket_timeout=self.read_timeout,
                        retry=Retry(NoBackoff(), 0), **self._options())
                    current = self._client = (gen, client, {})
        return current[1], current[2]

    def call(self, op: Callable[[redis.Redis, str], T]) -> T:
        """``op(client, namespace)``, retried and failed over per the settings."""
        rounds = 0
        last: Exception | None = None
        while True:
            for _ in self.endpoints:
                endpoint = self.endpoint
                try:
                    return op(self._sync()[0], endpoint.namespace)
                except redis.AuthenticationError as exc:
                    raise self._error(endpoint, exc) from exc  # retrying cannot help
                except RETRYABLE as exc:
                    last = exc
                    self._fail_over(endpoint, exc)
                except redis.RedisError as exc:
                    raise self._error(endpoint, exc) from exc
            assert last is not None
            retry, retries = retry_policy(self.settings)
            if not retry or (retries is not None and rounds >= retries):
                raise self._unreachable(last, rounds + 1) from last
            delay = backoff(rounds)
            rounds += 1
            logger.warning("cannot reach Redis (%s) at %s: %s (retry %d in %.2fs)", self.role,
                           self._names(), self._clean(last), rounds, delay)
            time.sleep(delay)

    def _sync_lane(self) -> SyncLane | None:
        gen, params = self._gen, self._lane_params()
        if params is None:
            return None
        held: tuple[int, SyncLane] | None = getattr(self._lanes, "lane", None)
        if held is None or held[0] != gen or held[1].broken:
            lane = SyncLane.open(params, self._options()["client_name"],
                                 self.settings.broker_connection_timeout, self.read_timeout)
            held = self._lanes.lane = (gen, lane)
            with self._lock:
                keep = [x for x in self._all_lanes if not x.broken and x.thread.is_alive()]
                ended = [x for x in self._all_lanes if x not in keep]
                self._all_lanes = [*keep, lane]
            for old in ended:
                old.close()  # its thread has ended (or it broke): nobody else uses it
        return held[1]

    def run(self, name: str, args: Sequence[Any], *, durable: bool = False) -> Any:
        """Script ``name`` with ARGV = [namespace, *args], through ``call``. ``durable``:
        then ``WAIT`` for ``replicas_ack`` replicas on the same connection (WAIT counts
        this connection's writes), if that option is set."""
        replicas, timeout = self.durability.replicas if durable else 0, self.durability.timeout_ms

        def op(client: redis.Redis, namespace: str) -> Any:
            lane = self._sync_lane()
            if lane is not None:
                lane.spin = _SPIN.get()  # the lane is this thread's alone
                reply = lane.evalsha(script_sha(name), script_source(name), [namespace, *args])
                if replicas:
                    check_wait(lane.call("WAIT", replicas, timeout), replicas, timeout)
                return reply
            scripts = self._sync()[1]
            script = scripts.get(name)
            if script is None:
                script = scripts[name] = client.register_script(script_source(name))
            if not replicas:
                return script(args=[namespace, *args], client=client)
            with client.pipeline(transaction=False) as pipe:
                script(args=[namespace, *args], client=pipe)
                pipe.wait(replicas, timeout)
                reply, acked = pipe.execute()
            check_wait(acked, replicas, timeout)
            return reply

        return self.call(op)

    def can_run_once(self) -> bool:
        """Whether ``run_once`` can work here: one server, no TLS."""
        endpoint = self.endpoint
        return endpoint.sentinels is None and lane_params(endpoint.url) is not None

    def run_once(self, name: str, args: Sequence[Any]) -> Any:
        """Script ``name`` with ARGV = [namespace, *args] over this thread's lane, one
        attempt: no retries, no failover (the caller has another way; a worker's pool
        child settling a message, ``RedisTransport.settle_here``). It waits for the
        reply without spinning. Raises ``OperationalError`` on any failure, also where
        there is no lane (TLS) or the server is behind sentinels."""
        if not self.can_run_once():
            raise OperationalError("run_once: not behind sentinels or over TLS")
        try:
            self._check_pid()
            lane = self._sync_lane()
            assert lane is not None  # can_run_once: there are lane parameters
            lane.spin = False
            return lane.evalsha(script_sha(name), script_source(name),
                                [self.endpoint.namespace, *args])
        except redis.RedisError as exc:
            raise self._error(self.endpoint, exc) from exc

    @staticmethod
    @contextlib.contextmanager
    def crowded() -> Iterator[None]:
        """Inside: this thread's scripts wait for their reply without spinning, since
        other threads of the process wait on it too and need the CPU (the producer's
        group commit, ``producer/batching.py``, when callers queue behind a round trip)."""
        token = _SPIN.set(False)
        try:
            yield
        finally:
            _SPIN.reset(token)

    def command(self, build: Callable[[str], Sequence[Any]]) -> Any:
        """One command, its arguments ``build(namespace)``, over the lane where there is
        one (redis-py's ``execute_command`` otherwise), through ``call``."""
        def op(client: redis.Redis, namespace: str) -> Any:
            args = build(namespace)
            lane = self._sync_lane()
            if lane is not None:
                return lane.call(*args)
            return client.execute_command(*args)  # type: ignore[no-untyped-call]

        return self.call(op)

    def pipeline(self, build: Callable[[str], Sequence[Sequence[Any]]], *,
                 spin: bool = False) -> list[Any] | None:
        """The commands ``build(namespace)`` in one write over this thread's lane, their
        replies in order (hiredis's raw forms), through ``call``; None where there is no
        lane (TLS): the caller uses redis-py. ``spin``: ``SyncLane.pipeline``'s."""
        def op(client: redis.Redis, namespace: str) -> list[Any] | None:
            lane = self._sync_lane()
            if lane is None:
                return None
            return lane.pipeline(*build(namespace), spin=spin)

        return self.call(op)

    def _fail_over(self, failed: Endpoint, exc: BaseException) -> None:
        with self._lock:
            if isinstance(exc, NotReplicated) or self.endpoint is not failed:
                return  # the server answered; or another caller moved on already
            if failed.sentinels is not None:
                # The master we knew is gone or demoted: ask the sentinels again next time
                # (mid-failover they may still name it; the caller's backoff spaces that).
                master = self._masters.pop(self._current, None)
                if master is not None:
                    self._gen += 1
                    logger.warning("Redis (%s) master %s failed (%s); asking the sentinels "
                                   "again", self.role, where(master), self._clean(exc))
                return
            if len(self.endpoints) > 1:
                self._current = (self._current + 1) % len(self.endpoints)
                self._gen += 1
                logger.warning("Redis (%s) at %s failed (%s); failing over to %s", self.role,
                               failed.safe, self._clean(exc), self.endpoint.safe)

    # -- asynchronous (the worker's event loop) -------------------------------------------
    def _async(self) -> tuple[aredis.Redis, dict[str, AsyncScript]]:
        self._check_pid()
        loop = asyncio.get_running_loop()
        current = self._aclient
        if current is None or current[0] != self._gen or current[1] is not loop:
            if current is not None and current[1] is loop:
                self._stale.append(current[2])  # closed by aclose(), once nothing uses it
            # socket_timeout=None: BLPOP and pub/sub reads block for as long as they ask;
            # a peer that vanished is found by TCP keepalive or by the caller's guard.
            gen, url = self._gen, self._url()
            client = aredis.Redis.from_url(
                url, socket_timeout=None,
                retry=AsyncRetry(NoBackoff(), 0), **self._options())
            current = self._aclient = (gen, loop, client, {})
        return current[2], current[3]

    def aclient(self) -> aredis.Redis:
        return self._async()[0]

    async def acall(self, op: Callable[[aredis.Redis, str], Awaitable[T]]) -> T:
        """``op(client, namespace)``; on a connection error, reconnect (to the next URL, if
        there are several) and try once more, then raise ``BrokerUnavailable``."""
        for attempt in (1, 2):
            endpoint = self.endpoint
            try:
                if endpoint.sentinels is not None:
                    await self._aresolve()
                return await op(self._async()[0], endpoint.namespace)
            except redis.AuthenticationError as exc:
                raise self._error(endpoint, exc) from exc
            except RETRYABLE as exc:
                self.async_failures += 1
                if attempt == 2:
                    raise self._unreachable(exc, 2) from exc
                logger.warning("Redis (%s) at %s: %s; reconnecting", self.role, endpoint.safe,
                               self._clean(exc))
                self._fail_over(endpoint, exc)
            except redis.RedisError as exc:
                raise self._error(endpoint, exc) from exc
        raise AssertionError("unreachable")

    async def _async_lane(self) -> AsyncLane | None:
        gen, params = self._gen, self._lane_params()
        if params is None:
            return None
        loop = asyncio.get_running_loop()
        held = self._alane
        if held is not None and held[0] == gen and held[1] is loop:
            opening = held[2]
            if not opening.done():
                return await asyncio.shield(opening)  # another caller is connecting
            if opening.exception() is None and not opening.result().broken:
                return opening.result()
        # One connection attempt at a time; its callers share the outcome.
        opening = loop.create_future()
        self._alane = (gen, loop, opening)
        try:
            lane = await AsyncLane.open(params, self._options()["client_name"],
                                        self.settings.broker_connection_timeout)
        except BaseException as exc:
            # The opener's cancellation is its own: the callers sharing this attempt get a
            # connection error they retry, not a cancellation that would end them quietly.
            opening.set_exception(redis.ConnectionError("connecting was interrupted")
                                  if isinstance(exc, asyncio.CancelledError) else exc)
            opening.exception()  # retrieved: a failure nobody else awaited is not news
            raise
        opening.set_result(lane)
        return lane

    @property
    def generation(self) -> int:
        """Bumped when the server to talk to changes: a lane of an older one is stale."""
        return self._gen

    async def open_lane(self) -> tuple[int, AsyncLane] | None:
        """A lane of the caller's own to the current server, with its ``generation``; None
        where only redis-py will do (TLS). For a blocking command with a script pipelined
        behind it (the Redis transport's sleeper), which would hold up the shared lane."""
        gen, params = self._gen, self._lane_params()
        if params is None:
            return None
        lane = await AsyncLane.open(params, self._options()["client_name"],
                                    self.settings.broker_connection_timeout)
        return gen, lane

    async def arun(self, name: str, args: Sequence[Any]) -> Any:
        """Script ``name`` with ARGV = [namespace, *args], through ``acall``."""
        async def op(client: aredis.Redis, namespace: str) -> Any:
            lane = await self._async_lane()
            if lane is not None:
                try:
                    # A server that keeps the connection but never answers must not hold
                    # the worker's pump (and its lease renewals) forever.
                    async with asyncio.timeout(self.read_timeout):
                        return await lane.evalsha(script_sha(name), script_source(name),
                                                  [namespace, *args])
                except asyncio.CancelledError:
                    # The reply may come after all: this connection is out of step.
                    lane.close()
                    raise
                except TimeoutError as exc:
                    lane.close()  # out of step too
                    raise redis.TimeoutError(
                        f"no reply to {name} within {self.read_timeout}s") from exc
            scripts = self._async()[1]
            script = scripts.get(name)
            if script is None:
                script = scripts[name] = client.register_script(script_source(name))
            return await script(args=[namespace, *args], client=client)

        return await self.acall(op)

    async def aclose(self) -> None:
        """Close this loop's async connections (another loop's are left alone)."""
        self._check_pid()
        loop = asyncio.get_running_loop()
        if self._alane is not None and self._alane[1] is loop:
            lane, self._alane = self._alane, None
            if lane[2].done() and lane[2].exception() is None:
                lane[2].result().close()
        if self._aclient is not None and self._aclient[1] is not loop:
            return
        current, self._aclient = self._aclient, None
        stale, self._stale = self._stale, []
        clients = stale + ([current[2]] if current is not None else [])
        for client in clients:
            try:
                await client.aclose()
            except (redis.RedisError, OSError) as exc:
                logger.debug("closing a Redis connection: %s", exc)

    def close(self) -> None:
        """Close this process's synchronous connections. Async ones belong to their event
        loop (``aclose``); when it is gone, dropping them is all that is left to do."""
        if self._pid != os.getpid():
            self._check_pid()
            return
        with self._lock:
            current, self._client = self._client, None
            lanes, self._all_lanes = self._all_lanes, []
        self._lanes = threading.local()
        for lane in lanes:
            lane.close()
        if current is not None:
            current[1].close()
        self._aclient, self._stale, self._alane = None, [], None

    # -- errors -------------------------------------------------------------------------
    def _names(self) -> str:
        return ", ".join(e.safe for e in self.endpoints)

    def _clean(self, exc: BaseException) -> str:
        text = str(exc) or type(exc).__name__
        for endpoint in self.endpoints:
            for secret in endpoint.secrets:
                text = text.replace(secret, "***")
        return text

    def _unreachable(self, exc: BaseException, attempts: int) -> BrokerUnavailable:
        return BrokerUnavailable(
            f"cannot reach the Redis {self.role} at {self._names()} after {attempts} "
            f"attempt(s): {self._clean(exc)}")

    def _error(self, endpoint: Endpoint, exc: BaseException) -> OperationalError:
        return OperationalError(
            f"the Redis {self.role} at {endpoint.safe} failed: {type(exc).__name__}: "
            f"{self._clean(exc)}")

