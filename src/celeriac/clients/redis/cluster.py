"""The clients of one Redis Cluster (``redis+cluster://``): what ``Connector`` is for one
server, on redis-py's cluster clients, which follow the slot map (MOVED, ASK, a failed
node's slots taken over by its replica).

A script must run on the node that holds its keys, and every key it touches must be in
one slot (Redis refuses a script that reaches a key of another node; keys of one node but
different slots would break when a slot moves). So a script call names one routing key,
a hash tag ``{<namespace>:<name>}`` (``tag``): it is passed as KEYS[1], which only routes
the call, and as the script's namespace (ARGV[1]), so every key the script builds starts
with that tag and lands in its slot. The transport gives each queue its own tag; the
result backend uses the namespace's own tag for its feed and a tag per chord.

Lanes (``lanes.py``) are not used here: the cluster clients pick the node per call.
Retries are as in ``Connector``: synchronous calls per the settings with backoff, async
calls once more, then ``BrokerUnavailable``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import redis
import redis.asyncio as aredis
from redis.asyncio.cluster import ClusterNode as AsyncNode
from redis.asyncio.cluster import RedisCluster as AsyncCluster
from redis.cluster import ClusterNode, RedisCluster

from ...errors import BrokerUnavailable, ConfigurationError, OperationalError
from ..net import backoff, retry_policy
from .scripts import check_wait, script_sha, script_source
from .topology import DRIVER, parse

if TYPE_CHECKING:
    from ...settings import Settings

logger = logging.getLogger("celeriac.redis.cluster")

T = TypeVar("T")
# A node down or a slot moving: worth another try once the map is read again.
RETRYABLE = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ClusterDownError,
             redis.exceptions.TryAgainError, redis.ReadOnlyError, TimeoutError)


class ClusterConnector:
    """One Redis Cluster's clients for this process (sync) and one event loop (async)."""

    def __init__(self, urls: Sequence[str], settings: Settings, role: str, *,
                 read_timeout: float | None, options: Mapping[str, Any] | None = None) -> None:
        endpoints, self.durability = parse(urls, options or {}, role)
        self.endpoint = endpoints[0]
        if not self.endpoint.cluster:
            raise ConfigurationError(f"{self.endpoint.safe!r} is not a redis+cluster:// URL")
        self.settings = settings
        self.role = role
        self.read_timeout = read_timeout
        self.async_failures = 0
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._client: RedisCluster | None = None
        self._aclient: tuple[asyncio.AbstractEventLoop, AsyncCluster] | None = None

    def tag(self, name: str) -> str:
        """The hash tag of ``name`` in this namespace: the keys of one queue (or of the
        result feed) start with it, so they share a slot."""
        return "{" + f"{self.endpoint.namespace}:{name}" + "}"

    def _kwargs(self) -> dict[str, Any]:
        url = redis.connection.parse_url(self.endpoint.url)  # type: ignore[no-untyped-call]
        return {**DRIVER,
                **{k: url[k] for k in ("username", "password") if url.get(k) is not None}}

    def _check_pid(self) -> None:
        if self._pid != os.getpid():
            self._client, self._aclient = None, None  # the parent's sockets: never close them
            self._lock = threading.Lock()
            self._pid = os.getpid()

    # -- synchronous ----------------------------------------------------------------------
    def client(self) -> RedisCluster:
        self._check_pid()
        with self._lock:
            if self._client is None:
                self._client = RedisCluster(
                    startup_nodes=[ClusterNode(h, p)  # type: ignore[no-untyped-call]
                                   for h, p in self.endpoint.cluster],
                    socket_timeout=self.read_timeout,
                    socket_connect_timeout=self.settings.broker_connection_timeout,
                    socket_keepalive=True, **self._kwargs())
            return self._client

    def call(self, op: Callable[[RedisCluster, str], T]) -> T:
        """``op(client, namespace)``, retried per the settings."""
        rounds = 0
        while True:
            try:
                return op(self.client(), self.endpoint.namespace)
            except redis.AuthenticationError as exc:
                raise self._error(exc) from exc
            except RETRYABLE as exc:
                retry, retries = retry_policy(self.settings)
                if not retry or (retries is not None and rounds >= retries):
                    raise self._unreachable(exc, rounds + 1) from exc
                delay = backoff(rounds)
                rounds += 1
                logger.warning("cannot reach Redis Cluster (%s) at %s: %s (retry %d in "
                               "%.2fs)", self.role, self.endpoint.safe, exc, rounds, delay)
                time.sleep(delay)
            except redis.RedisError as exc:
                raise self._error(exc) from exc

    def run(self, name: str, tag: str, args: Sequence[Any], *, durable: bool = False) -> Any:
        """Script ``name`` on the node of ``tag``'s slot, with ARGV = [tag, *args]."""
        replicas, timeout = self.durability.replicas if durable else 0, self.durability.timeout_ms

        def op(client: RedisCluster, ns: str) -> Any:
            if not replicas:
                return _evalsha(client, name, tag, args)
            # WAIT counts the writes of its own connection: one pipeline to that node.
            node = client.get_node_from_key(tag)  # type: ignore[no-untyped-call]
            conn = client.get_redis_connection(node)
            for attempt in (1, 2):
                with conn.pipeline(transaction=False) as pipe:
                    pipe.evalsha(script_sha(name), 1, tag, tag, *args)
                    pipe.wait(replicas, timeout)
                    try:
                        reply, acked = pipe.execute()
                        break
                    except redis.exceptions.NoScriptError:
                        if attempt == 2:
                            raise
                        conn.script_load(script_source(name))  # nothing ran: run it again
            check_wait(acked, replicas, timeout)
            return reply

        return self.call(op)

    # -- asynchronous ---------------------------------------------------------------------
    def aclient(self) -> AsyncCluster:
        self._check_pid()
        loop = asyncio.get_running_loop()
        if self._aclient is None or self._aclient[0] is not loop:
            # No socket timeout: BLPOP blocks as long as it asks; the caller guards it.
            client = AsyncCluster(
                startup_nodes=[AsyncNode(h, p) for h, p in self.endpoint.cluster],
                socket_connect_timeout=self.settings.broker_connection_timeout,
                socket_keepalive=True, **self._kwargs())
            self._aclient = (loop, client)
        return self._aclient[1]

    async def acall(self, op: Callable[[AsyncCluster, str], Awaitable[T]]) -> T:
        """``op(client, namespace)``; on a connection error, once more, then
        ``BrokerUnavailable``."""
        for attempt in (1, 2):
            try:
                return await op(self.aclient(), self.endpoint.namespace)
            except redis.AuthenticationError as exc:
                raise self._error(exc) from exc
            except RETRYABLE as exc:
                self.async_failures += 1
                if attempt == 2:
                    raise self._unreachable(exc, 2) from exc
                logger.warning("Redis Cluster (%s) at %s: %s; trying again", self.role,
                               self.endpoint.safe, exc)
            except redis.RedisError as exc:
                raise self._error(exc) from exc
        raise AssertionError("unreachable")

    async def arun(self, name: str, tag: str, args: Sequence[Any]) -> Any:
        async def op(client: AsyncCluster, ns: str) -> Any:
            try:
                return await client.evalsha(script_sha(name), 1, tag, tag, *args)
            except redis.exceptions.NoScriptError:
                # A node that never ran it (or a replica just promoted): EVAL caches it.
                return await client.eval(script_source(name), 1, tag, tag, *args)

        return await self.acall(op)

    async def node_client(self) -> aredis.Redis:
        """A plain client to the first node of the URL that answers (pub/sub: a Cluster
        relays PUBLISH to every node, so any one will do while it lives)."""
        timeout = self.settings.broker_connection_timeout
        failures = []
        for host, port in self.endpoint.cluster:
            client = aredis.Redis(host=host, port=port, socket_timeout=None,
                                  socket_connect_timeout=timeout, **self._kwargs())
            try:
                async with asyncio.timeout(timeout):
                    await client.ping()
                return client
            except (redis.RedisError, OSError, TimeoutError) as exc:
                failures.append(f"{host}:{port}: {exc or type(exc).__name__}")
                await client.aclose()
        raise redis.ConnectionError("no node of the cluster answered (" +
                                    "; ".join(failures) + ")")

    async def aclose(self) -> None:
        self._check_pid()
        held, self._aclient = self._aclient, None
        if held is not None and held[0] is asyncio.get_running_loop():
            try:
                await held[1].aclose()
            except (redis.RedisError, OSError) as exc:
                logger.debug("closing a Redis Cluster client: %s", exc)

    def close(self) -> None:
        if self._pid != os.getpid():
            self._check_pid()
            return
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
        self._aclient = None

    # -- errors ---------------------------------------------------------------------------
    def _clean(self, exc: BaseException) -> str:
        text = str(exc) or type(exc).__name__
        for secret in self.endpoint.secrets:
            text = text.replace(secret, "***")
        return text

    def _unreachable(self, exc: BaseException, attempts: int) -> BrokerUnavailable:
        return BrokerUnavailable(
            f"cannot reach the Redis Cluster ({self.role}) at {self.endpoint.safe} after "
            f"{attempts} attempt(s): {self._clean(exc)}")

    def _error(self, exc: BaseException) -> OperationalError:
        return OperationalError(
            f"the Redis Cluster ({self.role}) at {self.endpoint.safe} failed: "
            f"{type(exc).__name__}: {self._clean(exc)}")


def _evalsha(client: RedisCluster, name: str, tag: str, args: Sequence[Any]) -> Any:
    try:
        return client.evalsha(script_sha(name), 1, tag, tag, *args)
    except redis.exceptions.NoScriptError:
        return client.eval(script_source(name), 1, tag, tag, *args)
