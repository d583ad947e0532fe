"""Celery compatibility mode: which class a URL's ``layout`` parameter selects.

``redis://...?layout=kombu`` (broker): kombu's Redis layout, shared with Celery's workers
and producers (``transports/kombu_redis.py``). ``amqp://...?layout=kombu``: RabbitMQ
queues declared exactly as Celery declares them, events and remote control on Celery's
exchanges (``transports/amqp/kombu.py``).
``redis://...?layout=celery`` (result backend): Celery's ``celery-task-meta-<id>`` keys
(``backends/celery_redis.py``). ``db+postgresql://`` needs no parameter: it is Celery's
own URL for its SQLAlchemy backend (``backends/celery_db.py``). Without ``layout`` a URL
means celeriac's own layout; any other value is an error naming the known ones.
"""

from __future__ import annotations

import importlib
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from .errors import ConfigurationError

TRANSPORT_LAYOUTS: dict[tuple[str, str], tuple[str, str]] = {
    ("redis", "kombu"): ("celeriac.transports.kombu_redis", "KombuRedisTransport"),
    ("rediss", "kombu"): ("celeriac.transports.kombu_redis", "KombuRedisTransport"),
    ("amqp", "kombu"): ("celeriac.transports.amqp.kombu", "KombuAMQPTransport"),
    ("amqps", "kombu"): ("celeriac.transports.amqp.kombu", "KombuAMQPTransport"),
}
BACKEND_LAYOUTS: dict[tuple[str, str], tuple[str, str]] = {
    ("redis", "celery"): ("celeriac.backends.celery_redis", "CeleryRedisBackend"),
    ("rediss", "celery"): ("celeriac.backends.celery_redis", "CeleryRedisBackend"),
    # A kombu-layout broker URL that is also the result backend (no result_backend set):
    # Celery's results, as a Celery app with that one URL has.
    ("redis", "kombu"): ("celeriac.backends.celery_redis", "CeleryRedisBackend"),
    ("rediss", "kombu"): ("celeriac.backends.celery_redis", "CeleryRedisBackend"),
}


def layout(url: str) -> str | None:
    """The URL's ``layout`` parameter, or None."""
    for name, value in parse_qsl(urlsplit(url.strip()).query, keep_blank_values=True):
        if name == "layout":
            return value
    return None


def lookup(url: str, table: dict[tuple[str, str], tuple[str, str]], what: str) -> Any:
    """The class ``url``'s layout selects in ``table``; None without a ``layout``."""
    chosen = layout(url)
    if chosen is None:
        return None
    scheme = urlsplit(url.strip()).scheme
    entry = table.get((scheme, chosen))
    if entry is None:
        known = sorted(f"{s}://...?layout={name}" for s, name in table)
        raise ConfigurationError(
            f"layout={chosen!r} is not a {what} layout for {scheme}:// URLs; known: "
            + ", ".join(known))
    module, name = entry
    return getattr(importlib.import_module(module), name)
