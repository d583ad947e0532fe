"""Where Redis URLs point: one server (or a list to fail over along), a master watched by
Redis Sentinel, or a Redis Cluster; and the options those take.

Sentinel, in either of the forms Celery users write::

    redis+sentinel://[:password@]host1:26379;host2:26379;host3:26379/0?master=mymaster
    sentinel://[:password@]host1:26379/0;sentinel://host2:26379/0    (kombu's form)

with the master's name in the URL (``?master=`` or ``?master_name=``) or in the transport
options (``broker_transport_options={"master_name": "mymaster"}``, for results
``result_backend_transport_options``). A password in the URL is the Redis servers'; the
sentinels' own is ``sentinel_password`` (or kombu's ``sentinel_kwargs={"password": ...}``).
We ask the sentinels for the master's address and connect to it directly (so the lean
lanes of ``lanes.py`` serve it too); a lost connection or a READONLY reply (the old
master came back as a replica) makes us ask again.

Cluster: ``redis+cluster://host1:7000;host2:7001/0`` (any of its nodes; the rest are
discovered).

Either takes ``replicas_ack=<n>`` (URL or options) and ``replicas_ack_timeout=<ms>``
(default 1000): a publish returns only once ``n`` replicas have it (``WAIT``), which is
what closes the window in which a failover loses acknowledged publishes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import (
    SplitResult,
    parse_qsl,
    quote,
    unquote,
    urlencode,
    urlsplit,
    urlunsplit,
)

import redis.asyncio.sentinel as asentinel
import redis.connection
import redis.sentinel

from ...errors import ConfigurationError
from ..net import mask_password

DEFAULT_NAMESPACE = "celeriac"

try:
    from redis.driver_info import DriverInfo
except ImportError:  # an older redis-py, which reads its version once, at import
    DRIVER: dict[str, Any] = {}
else:
    # redis-py 8 reads its own version from the package metadata (a scan of sys.path) for
    # every connection it makes, for CLIENT SETINFO: ~1 ms each, 7 ms the first, for each
    # of the connections a worker opens as it starts (issue 30). Given once, to every
    # client we make; what Redis is told is the same ("redis-py", its version).
    DRIVER = {"driver_info": DriverInfo(lib_version=redis.__version__)}
"""Keyword arguments for every redis-py client (connector.py, cluster.py)."""
SENTINEL_SCHEMES = ("redis+sentinel", "sentinel")
CLUSTER_SCHEMES = ("redis+cluster",)
SCHEMES = ("redis", "rediss", "unix", *SENTINEL_SCHEMES, *CLUSTER_SCHEMES)
# Our query parameters: taken out before a URL reaches redis-py. ``layout``,
# ``visibility_timeout`` and ``global_keyprefix`` are the compatibility layout's
# (``clients/schemes.py``), read where the layout is chosen; other users of the same URL (the
# shared store) pass them by, but for the prefix (``_namespace``).
_OURS = ("namespace", "master", "master_name", "sentinel_password", "replicas_ack",
         "replicas_ack_timeout", "layout", "visibility_timeout", "global_keyprefix")


@dataclass(frozen=True, slots=True)
class Sentinels:
    hosts: tuple[tuple[str, int], ...]
    master: str
    password: str | None
    """The sentinels' own password (not the master's)."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    url: str
    """For redis-py: without our query parameters. Behind sentinels, the master's URL with
    ``_`` for its host (``master_url`` fills it in)."""
    safe: str
    """For messages and logs: the password masked."""
    namespace: str
    secrets: tuple[str, ...]
    """Strings that must never appear in a message (the password)."""
    sentinels: Sentinels | None = None
    cluster: tuple[tuple[str, int], ...] = ()
    """A Redis Cluster's startup nodes; empty: not a cluster."""
    db: int = 0
    """The database number, as redis-py reads it from ``url`` (always 0 on a Cluster)."""

    def channel(self, name: str) -> str:
        """The pub/sub channel of broadcast ``name`` (events, control commands, a call's
        replies): ``<namespace>:bc:<db>:<name>``. Keys live in one database, but pub/sub
        is server-wide: without the database in the name, apps on different databases of
        one server would hear (and command) each other's workers."""
        return f"{self.namespace}:bc:{self.db}:{name}"


@dataclass(frozen=True, slots=True)
class Durability:
    replicas: int = 0
    """``WAIT`` for this many replicas after each publish (0: do not wait)."""
    timeout_ms: int = 1000


def _split(piece: str, scheme: str) -> Any:
    """A piece of a ``;``-separated list; one without ``scheme://`` borrows the first's."""
    piece = piece.strip()
    return urlsplit(piece if "://" in piece else f"{scheme}://{piece}")


def _option(name: str, query: Mapping[str, str], options: Mapping[str, Any]) -> Any:
    return query.get(name) if name in query else options.get(name)


def _int(name: str, value: Any, where: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = -1
    if number < 0:
        raise ConfigurationError(f"{name} must be a whole number >= 0, got {value!r} ({where})")
    return number


def _namespace(query: Mapping[str, str], options: Mapping[str, Any], where: str) -> str:
    """``?namespace=``; without it, kombu's ``global_keyprefix`` (URL or transport
    option) in front of the default, so that an app sharing a Redis under a prefix keeps
    its own keys (revoked ids, leases) apart too."""
    if "namespace" in query:
        if not query["namespace"]:
            raise ConfigurationError(f"empty namespace in {where}")
        return query["namespace"]
    prefix = _option("global_keyprefix", query, options)
    return f"{prefix}{DEFAULT_NAMESPACE}" if prefix else DEFAULT_NAMESPACE


def parse(urls: Sequence[str], options: Mapping[str, Any], role: str
          ) -> tuple[list[Endpoint], Durability]:
    """The endpoints of ``urls`` (the pieces of a ``;``-separated setting) with the
    transport ``options``; ``role`` names the setting in errors."""
    pieces = [u.strip() for u in urls if u.strip()]
    if not pieces:
        raise ConfigurationError(f"no Redis URL for the {role}")
    first = urlsplit(pieces[0])
    if first.scheme not in SCHEMES:
        raise ConfigurationError(f"not a Redis URL: {mask_password(pieces[0])!r}")
    parts = [_split(p, first.scheme) for p in pieces]
    query: dict[str, str] = {}
    for p in parts:
        query.update(parse_qsl(p.query, keep_blank_values=True))
    where = f"the {role} URL {mask_password(';'.join(pieces))!r}"
    # The whole setting's namespace and durability, checked whatever the form (a
    # failover list's servers then each take their own namespace).
    namespace = _namespace(query, options, where)
    replicas = _option("replicas_ack", query, options)
    timeout = _option("replicas_ack_timeout", query, options)
    durability = Durability(_int("replicas_ack", replicas or 0, where),
                            _int("replicas_ack_timeout", timeout or 1000, where))
    if first.scheme in SENTINEL_SCHEMES:
        whole = _whole(pieces, parts, query, options, namespace, where)
        return [_behind_sentinels(whole, options, role)], durability
    if first.scheme in CLUSTER_SCHEMES:
        return [_cluster(_whole(pieces, parts, query, options, namespace, where))], durability
    return [_server(piece, p, options) for piece, p in zip(pieces, parts, strict=True)
            ], durability


@dataclass(frozen=True, slots=True)
class _Whole:
    """One endpoint made of every piece of a setting: the sentinels of one master, or
    a cluster's startup nodes."""

    parts: list[SplitResult]
    query: dict[str, str]
    """The parameters of all the pieces (a later piece's win)."""
    where: str
    namespace: str
    rest: str
    """The query for redis-py: without our parameters."""
    path: str
    """The first piece's path that names a database, else ``""``."""
    with_auth: SplitResult
    """The first piece with a user or a password, else the first."""
    secrets: tuple[str, ...]
    safe: str


def _whole(pieces: list[str], parts: list[SplitResult], query: dict[str, str],
           options: Mapping[str, Any], namespace: str, where: str) -> _Whole:
    with_auth = next((p for p in parts if p.password is not None or p.username), parts[0])
    secrets = tuple({t for s in (with_auth.password, query.get("password"),
                                 _option("sentinel_password", query, options))
                     if s for t in (s, unquote(s))})
    return _Whole(
        parts=parts, query=query, where=where, namespace=namespace,
        rest=urlencode([(k, v) for k, v in query.items() if k not in _OURS]),
        path=next((p.path for p in parts if p.path not in ("", "/")), ""),
        with_auth=with_auth, secrets=secrets, safe=mask_password(";".join(pieces)))


def _behind_sentinels(whole: _Whole, options: Mapping[str, Any], role: str) -> Endpoint:
    """The master the sentinels name: its URL has ``_`` for a host until asked."""
    query = whole.query
    master = query.get("master") or query.get("master_name") or options.get("master_name")
    if not master:
        raise ConfigurationError(
            f"{whole.where} names no master: add ?master=<name> to it, or set "
            f"{'result_backend' if 'result' in role else 'broker'}_transport_options="
            f"{{'master_name': <name>}}")
    kwargs = options.get("sentinel_kwargs") or {}
    password = (_option("sentinel_password", query, options)
                or (kwargs.get("password") if isinstance(kwargs, Mapping) else None))
    hosts = tuple((p.hostname or "localhost", p.port or 26379) for p in whole.parts)
    netloc = _userinfo(whole.with_auth) + "_"
    url = urlunsplit(("redis", netloc, whole.path or "/0", whole.rest, ""))
    return Endpoint(url, whole.safe, whole.namespace, whole.secrets,
                    sentinels=Sentinels(hosts, str(master), password),
                    db=_db(url, whole.where))


def _cluster(whole: _Whole) -> Endpoint:
    """A Redis Cluster, reached through any of its nodes (database 0 only)."""
    if whole.path not in ("", "/", "/0"):
        raise ConfigurationError(f"a Redis Cluster has database 0 only ({whole.where})")
    nodes = tuple((p.hostname or "localhost", p.port or 6379) for p in whole.parts)
    url = urlunsplit(("redis", _userinfo(whole.with_auth) + f"{nodes[0][0]}:{nodes[0][1]}",
                      "/0", whole.rest, ""))
    return Endpoint(url, whole.safe, whole.namespace, whole.secrets, cluster=nodes)


def _server(piece: str, p: SplitResult, options: Mapping[str, Any]) -> Endpoint:
    """One server of a failover list (or the only one), with its own parameters."""
    own = dict(parse_qsl(p.query, keep_blank_values=True))
    ns = _namespace(own, options, repr(mask_password(piece)))
    kept = urlencode([(k, v) for k, v in own.items() if k not in _OURS])
    own_secrets = tuple({t for s in (p.password, own.get("password")) if s
                         for t in (s, unquote(s))})
    plain, safe_piece = _unsplit(p._replace(query=kept)), mask_password(piece)
    return Endpoint(plain, safe_piece, ns, own_secrets, db=_db(plain, repr(safe_piece)))


def _unsplit(parts: Any) -> str:
    """``urlunsplit``, but ``unix:///path`` stays so (urlunsplit drops the empty host's
    ``//``, and redis-py refuses ``unix:/path``)."""
    url: str = urlunsplit(parts)
    if not parts.netloc and parts.path.startswith("/"):
        url = url.replace(f"{parts.scheme}:", f"{parts.scheme}://", 1)
    return url


def _db(url: str, where: str) -> int:
    """The database redis-py will select for ``url`` (``/<db>``, or ``?db=``)."""
    try:
        db = redis.connection.parse_url(url).get("db")  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise ConfigurationError(f"{exc} ({where})") from None
    return int(db or 0)


def parse_url(url: str) -> Endpoint:
    """One plain Redis URL (no Sentinel, no Cluster) as an ``Endpoint``."""
    [endpoint], _ = parse([url], {}, "broker")
    return endpoint


def _userinfo(parts: Any) -> str:
    if parts.password is None and not parts.username:
        return ""
    user = quote(unquote(parts.username or ""), safe="")
    if parts.password is None:
        return f"{user}@"
    return f"{user}:{quote(unquote(parts.password), safe='')}@"


def master_url(endpoint: Endpoint, host: str, port: int) -> str:
    """The URL of the master the sentinels named (``endpoint.url`` with its address)."""
    parts = urlsplit(endpoint.url)
    userinfo, _, _ = parts.netloc.rpartition("@")
    host = f"[{host}]" if ":" in host else host
    netloc = f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


def _sentinel_kwargs(sentinels: Sentinels, timeout: float) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    if sentinels.password:
        kwargs["password"] = sentinels.password
    return kwargs


def discover(endpoint: Endpoint, timeout: float) -> str:
    """The URL of the master the sentinels name now. Raises ``redis.ConnectionError``
    (``MasterNotFoundError``) when none of them answers for it: mid-failover, or down."""
    assert endpoint.sentinels is not None
    s = endpoint.sentinels
    sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
        list(s.hosts), sentinel_kwargs=_sentinel_kwargs(s, timeout))
    try:
        host, port = sentinel.discover_master(s.master)  # type: ignore[no-untyped-call]
    finally:
        for client in sentinel.sentinels:
            client.close()
    return master_url(endpoint, host, port)


async def adiscover(endpoint: Endpoint, timeout: float) -> str:
    """``discover`` on the running event loop (the worker must not block it)."""
    assert endpoint.sentinels is not None
    s = endpoint.sentinels
    sentinel = asentinel.Sentinel(  # type: ignore[no-untyped-call]
        list(s.hosts), sentinel_kwargs=_sentinel_kwargs(s, timeout))
    try:
        host, port = await sentinel.discover_master(s.master)
    finally:
        for client in sentinel.sentinels:
            await client.aclose()
    return master_url(endpoint, host, port)


def where(url: str) -> str:
    """host:port of a URL, for logs (never its password)."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}"
