"""Celery compatibility mode: which class a URL's ``layout`` parameter selects.

``redis://...?layout=kombu`` (broker): kombu's Redis layout, shared with Celery's workers
and producers (``redis_broker.py``). ``amqp://...?layout=kombu``: RabbitMQ
queues declared exactly as Celery declares them, events and remote control on Celery's
exchanges (``amqp_broker.py``).
``redis://...?layout=celery`` (result backend): Celery's ``celery-task-meta-<id>`` keys
(``redis_results.py``). ``db+postgresql://`` needs no parameter: it is Celery's
own URL for its SQLAlchemy backend (``db_results.py``). Without ``layout`` a URL
means celeriac's own layout; any other value is an error naming the known ones.
"""

from __future__ import annotations

import importlib
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from ..errors import ConfigurationError

TRANSPORT_LAYOUTS: dict[tuple[str, str], tuple[str, str]] = {
    ("redis", "kombu"): ("celeriac.compat.redis_broker", "KombuRedisTransport"),
    ("rediss", "kombu"): ("celeriac.compat.redis_broker", "KombuRedisTransport"),
    ("amqp", "kombu"): ("celeriac.compat.amqp_broker", "KombuAMQPTransport"),
    ("amqps", "kombu"): ("celeriac.compat.amqp_broker", "KombuAMQPTransport"),
}
BACKEND_LAYOUTS: dict[tuple[str, str], tuple[str, str]] = {
    ("redis", "celery"): ("celeriac.compat.redis_results", "CeleryRedisBackend"),
    ("rediss", "celery"): ("celeriac.compat.redis_results", "CeleryRedisBackend"),
    # A kombu-layout broker URL that is also the result backend (no result_backend set):
    # Celery's results, as a Celery app with that one URL has.
    ("redis", "kombu"): ("celeriac.compat.redis_results", "CeleryRedisBackend"),
    ("rediss", "kombu"): ("celeriac.compat.redis_results", "CeleryRedisBackend"),
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
