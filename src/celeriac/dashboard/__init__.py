"""``celeriac dashboard``: a live web view of a cluster, and ``/metrics`` for Prometheus.

The dashboard is an ASGI app (Starlette). Its lifespan subscribes to the event channel
(``celeriac.events.EventReceiver``), applies every event to a ``ClusterState`` and fans
coalesced updates out to the browsers connected to ``/api/events`` (server-sent events).
Nothing is stored: what the dashboard knows is what it heard since it started.

Layout of the package:

- ``monitor``: the receiver loop, the state, throughput history, runtime histograms,
  queue lengths.
- ``stream``: SSE clients with bounded queues (a slow browser is dropped, never waited
  for) and the ASGI response that writes to one.
- ``metrics``: the Prometheus collector reading the monitor.
- ``security``: HTTP basic auth, the Host check against DNS rebinding, response headers.
- ``actions``: the POST actions (revoke, pool grow/shrink, rate limit, shutdown) through
  ``app.control``, their CSRF protection, the read-only switch.
- ``web``: ``create_app``, the routes and the JSON views.
- ``static/``: the page (HTML, CSS, vanilla JS; no build step, no CDN).

Starlette, uvicorn and prometheus-client come with ``pip install 'celeriac[dashboard]'``;
this module imports them only when ``create_app`` is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError

if TYPE_CHECKING:
    from starlette.applications import Starlette

EXTRA = "pip install 'celeriac[dashboard]'"


def require_dependencies() -> None:
    """Raise ``ConfigurationError`` naming the extra when a dependency is missing."""
    missing = []
    for module in ("starlette", "uvicorn", "prometheus_client"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise ConfigurationError(
            f"the dashboard needs {', '.join(missing)}: {EXTRA}"
        )


def create_app(*args: Any, **kwargs: Any) -> Starlette:
    """Build the dashboard's ASGI app; see ``celeriac.dashboard.web.create_app``."""
    require_dependencies()
    # Deferred: web.py needs starlette (the dashboard extra, checked just above).
    from .web import create_app as _create_app

    return _create_app(*args, **kwargs)


__all__ = ["EXTRA", "create_app", "require_dependencies"]
