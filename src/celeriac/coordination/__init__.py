"""The store the cluster's workers coordinate through, for global rate limits
(``worker/globalrate.py``) and Gossip's elections (``worker/gossip.py``).

``store_for(settings, purpose)`` picks it from the URLs the app already has, so there
is nothing more to configure: the broker when it has a store of its own (Redis, the
SQLite file, memory), else the result backend (Redis, PostgreSQL, SQLite). A RabbitMQ
broker with another result backend has none: that is a ``ConfigurationError`` naming
``purpose`` (e.g. ``task 'proj.add': global_rate_limit``), raised when the worker starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from .._net import mask_password
from ..errors import ConfigurationError
from .base import Grant, SharedStore, batch_for, bucket_take

if TYPE_CHECKING:
    from ..settings import Settings

REDIS = ("redis", "rediss", "unix")
POSTGRES = ("postgresql", "postgres")


def store_for(settings: Settings, purpose: str) -> SharedStore:
    """The shared store for ``purpose``; see the module's docstring."""
    broker = settings.broker_url
    scheme = urlsplit(broker.split(";")[0].strip()).scheme
    if scheme in REDIS:
        from .redis import RedisStore

        return RedisStore(broker.split(";"), settings)
    if scheme == "sqlite":
        from .sqlite import SQLiteStore

        return SQLiteStore(broker.split(";")[0].strip())
    if scheme == "memory":
        from .memory import memory_store

        return memory_store(broker.split(";")[0].strip())
    backend = settings.backend_url
    bscheme = urlsplit(backend.split(";")[0].strip()).scheme
    if bscheme in REDIS:
        from .redis import RedisStore

        return RedisStore(backend.split(";"), settings)
    if bscheme in POSTGRES:
        from .postgres import PostgresStore

        return PostgresStore(backend, settings.broker_connection_timeout)
    if bscheme == "sqlite":
        from .sqlite import SQLiteStore

        return SQLiteStore(backend)
    raise ConfigurationError(
        f"{purpose} needs a store every worker shares, and neither the broker "
        f"({mask_password(broker)}) nor the result backend ({mask_password(backend)}) "
        "is one: use a redis:// or postgresql:// result_backend (or a Redis or SQLite "
        "broker)")


__all__ = ["Grant", "SharedStore", "batch_for", "bucket_take", "store_for"]
