"""The shared store: where the processes of a deployment keep what they coordinate
through (``base.SharedStore``: leases, token buckets, beat's entries and run keys,
revoked ids), one class per service: ``memory``, ``sqlite``, ``redis`` (one server, a
failover list, Sentinel), ``postgres``.

Which store a deployment uses is read from the URLs it already has, so there is nothing
more to configure. **The rule** (``store_url``), the same for every user (beat, global
rate limits, Gossip's elections, revoked ids): the result backend's store, else the
broker's, among those with a store class in ``STORES``; a store other processes reach
(Redis, PostgreSQL, SQLite) before one only this process reaches (memory). A RabbitMQ
broker with an ``rpc://`` (or no) result backend has none: beat, a global rate limit and
an election then raise ``ConfigurationError`` naming what needs it; revoked ids are then
remembered by the broadcast and ``--statedb`` only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..clients.net import mask_password
from ..clients.schemes import SchemeRegistry
from ..errors import ConfigurationError
from .base import (
    BEAT_LEASE,
    LEDGER_LENGTH,
    RUN_KEY_TTL,
    Grant,
    Lease,
    Run,
    SharedStore,
    batch_for,
    bucket_take,
    parse_run_key,
    run_key,
)

if TYPE_CHECKING:
    from ..settings import Settings

_REDIS = ("celeriac.stores.redis", "RedisStore")
_POSTGRES = ("celeriac.stores.postgres", "PostgresStore")
STORES: SchemeRegistry[SharedStore] = SchemeRegistry("shared store", "shared store", {
    "memory": ("celeriac.stores.memory", "MemoryStore"),
    "sqlite": ("celeriac.stores.sqlite", "SQLiteStore"),
    # Cluster URLs (redis+cluster://) are not here: clients.redis.Connector has no Cluster
    # client, and a Cluster broker's or backend's deployment uses the other URL's store.
    **dict.fromkeys(("redis", "rediss", "unix", "redis+sentinel", "sentinel"), _REDIS),
    **dict.fromkeys(("postgresql", "postgres"), _POSTGRES),
})


def register(scheme: str, cls: type[SharedStore]) -> None:
    """Add a shared store for ``scheme://`` URLs (third-party stores)."""
    STORES.register(scheme, cls)


def find_url(settings: Settings) -> str | None:
    """The URL of the deployment's shared store (the rule: the module's docstring), or
    None where neither URL has one."""
    found = [url for url in (settings.result_backend, settings.broker_url)
             if url and url.strip() and STORES.handles(url.split(";")[0].strip())]
    for url in found:
        if not STORES.lookup(url.split(";")[0].strip()).process_local:
            return url.strip()
    return found[0].strip() if found else None


def store_url(settings: Settings, purpose: str = "beat") -> str:
    """``find_url``, or ``ConfigurationError`` naming ``purpose`` (what needs a store,
    e.g. ``task 'proj.add': global_rate_limit``) and what to set."""
    url = find_url(settings)
    if url is None:
        raise ConfigurationError(
            f"{purpose} needs a store every process shares, and neither the result "
            f"backend ({mask_password(settings.result_backend or 'none')}) nor the broker "
            f"({mask_password(settings.broker_url)}) is one: set result_backend to a "
            "redis://, postgresql:// or sqlite:// URL (or use a Redis or SQLite broker)")
    return url


def open_store(settings: Settings, url: str | None = None, purpose: str = "beat"
               ) -> SharedStore:
    """The store at ``url``, by default the deployment's (``store_url``)."""
    url = url or store_url(settings, purpose)
    first = url.split(";")[0].strip()
    if not STORES.handles(first):
        raise ConfigurationError(f"{mask_password(url)!r} cannot hold a shared store: use "
                                 + ", ".join(f"{s}://" for s in STORES.known()))
    return STORES.lookup(first)(url, settings)


def store_for(settings: Settings, purpose: str) -> SharedStore:
    """The deployment's store for ``purpose`` (``ConfigurationError`` without one)."""
    return open_store(settings, None, purpose)


__all__ = ["BEAT_LEASE", "LEDGER_LENGTH", "RUN_KEY_TTL", "STORES", "Grant", "Lease", "Run",
           "SharedStore", "batch_for", "bucket_take", "find_url", "open_store",
           "parse_run_key", "register", "run_key", "store_for", "store_url"]
