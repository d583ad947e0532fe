"""The shared stores flow control runs on (issue 29), as a worker's and a producer's
environment: ``store_env("redis" | "postgres" | "sqlite", prefix, **settings)``.

- ``redis``: Redis broker and results, so the store is Redis;
- ``postgres``: Redis broker, PostgreSQL results: the store is the result backend's
  (``stores.find_url``: the backend's before the broker's);
- ``sqlite``: one SQLite file for broker and results.

Each gets a namespace (or file) of its own, deleted after.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from celeriac import Settings
from celeriac.stores import open_store
from tests.contracts.conftest import _drop_redis_namespace
from tests.integration.support import ROOT
from tests.services import require

STORES = ("redis", "postgres", "sqlite")


@contextmanager
def store_env(kind: str, prefix: str, db_dir: Path, **settings: Any
              ) -> Iterator[dict[str, str]]:
    """``CELERIAC_*`` variables for a worker and a producer whose shared store is
    ``kind``, with ``settings``; ``env["NAMESPACE"]`` is the namespace (or file stem)."""
    ns = f"{prefix}{uuid.uuid4().hex[:10]}"
    redis = f"{require('redis')}?namespace={ns}" if kind != "sqlite" else ""
    broker = backend = redis
    if kind == "postgres":
        backend = f"{require('postgres')}?namespace={ns}"
    elif kind == "sqlite":
        broker = backend = f"sqlite:///{db_dir / f'{ns}.db'}"
    env = {"CELERIAC_BROKER_URL": broker, "CELERIAC_RESULT_BACKEND": backend,
           "PYTHONPATH": str(ROOT), "NAMESPACE": ns,
           **{f"CELERIAC_{k.upper()}": str(v) for k, v in settings.items()}}
    try:
        yield env
    finally:
        if kind == "postgres":
            drop_postgres(backend)
        if redis:
            _drop_redis_namespace(redis)


def drop_postgres(url: str) -> None:
    """Drop the store's and the results' tables of ``url``'s namespace."""
    import psycopg
    from psycopg import sql

    store = open_store(Settings(result_backend=url), url)
    store.drop()  # type: ignore[attr-defined]
    store.close()
    ns = url.partition("namespace=")[2].partition("&")[0]
    with psycopg.connect(url.partition("?")[0], autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(f"{ns}_results")))
