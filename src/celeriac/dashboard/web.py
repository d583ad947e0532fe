"""``create_app``: the dashboard's routes.

=====================  ==============================================================
``/``                   the page (``static/index.html``)
``/static/<file>``      its script and style
``/api/workers``        workers with status, active, processed, load
``/api/tasks``          tasks, most recently updated first; ``state``, ``name``,
                        ``worker``, ``limit`` (default 100, at most 10,000) filter them;
                        each with ``progress`` (its last ``update_state`` meta),
                        ``progress_text`` and ``progress_ratio``
``/api/tasks/<uuid>``   one task, traceback included (404 when unknown)
``/api/queues``         queue lengths, read now
``/api/beat``           beat: its entries (schedule, enabled, last and next run), the
                        leading beat (from the store), the last ``beat-sent`` events
``/api/stats``          counts by state, throughput history, cluster statistics
``/api/events``         ``text/event-stream``: ``tick`` (workers, counts, queues, the
                        last seconds of throughput) every second, ``tasks`` (changed
                        tasks) every quarter second
``/metrics``            Prometheus text format
``/api/config``,        what the page may offer, the CSRF token, and the POST actions:
``/api/csrf``,          see ``actions`` (all refused with ``read_only``)
``/api/actions/*``
``/api/dead``,          the dead letters: list, inspect; requeue and purge are actions
``/api/dead/<id>``      (``dead.py``)
=====================  ==============================================================

Every URL the page uses is relative, so the dashboard also works behind a reverse proxy
under a path prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator, Iterable
from importlib import resources
from typing import TYPE_CHECKING, Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import CeleriacError
from ..events import ClusterState
from .actions import Actions
from .dead import DeadLetters
from .metrics import registry_for
from .monitor import Monitor, task_summary, task_view
from .security import SecurityMiddleware
from .stream import EventStream, encode

if TYPE_CHECKING:
    from ..app import Celeriac

logger = logging.getLogger("celeriac.dashboard.web")

MAX_LIMIT = 10_000
STATIC = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "actions.js": "text/javascript; charset=utf-8",
    "dead.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}


class JSON(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, default=str, option=orjson.OPT_NON_STR_KEYS)


def _error(status: int, message: str) -> JSON:
    return JSON({"error": message}, status_code=status)


class Asset:
    def __init__(self, name: str) -> None:
        self.body = resources.files(__package__).joinpath("static", name).read_bytes()
        self.media_type = STATIC[name]
        self.etag = '"' + hashlib.sha256(self.body).hexdigest()[:16] + '"'

    def response(self, request: Request) -> Response:
        headers = {"etag": self.etag, "cache-control": "no-cache"}
        if request.headers.get("if-none-match") == self.etag:
            return Response(status_code=304, headers=headers)
        return Response(self.body, media_type=self.media_type, headers=headers)


class Views:
    def __init__(self, monitor: Monitor, actions: Actions) -> None:
        self.monitor = monitor
        self.actions = actions
        self.state = monitor.state
        self.assets = {name: Asset(name) for name in STATIC}
        self.registry = registry_for(monitor)

    async def index(self, request: Request) -> Response:
        response = self.assets["index.html"].response(request)
        if self.actions.enabled:  # a fresh CSRF token with each load of the page
            self.actions.csrf.set_cookie(response, request)
        return response

    async def static(self, request: Request) -> Response:
        asset = self.assets.get(request.path_params["name"])
        if asset is None or asset is self.assets["index.html"]:
            return Response("not found\n", status_code=404, media_type="text/plain")
        return asset.response(request)

    async def workers(self, request: Request) -> Response:
        return JSON({"workers": self.monitor.workers()})

    async def tasks(self, request: Request) -> Response:
        q = request.query_params
        try:
            limit = int(q.get("limit") or 100)
        except ValueError:
            return _error(400, "limit must be an integer")
        if not 1 <= limit <= MAX_LIMIT:
            return _error(400, f"limit must be between 1 and {MAX_LIMIT}")
        state = (q.get("state") or "").upper()
        name = q.get("name") or ""
        worker = q.get("worker") or ""
        # Start from one of the state's indexes when a filter allows it; every source is
        # ordered most recently updated first.
        candidates: Iterable[Any]
        if state:
            candidates = self.state.tasks_by_state(state)
        elif name:
            candidates = self.state.tasks_by_type(name)
        elif worker:
            candidates = self.state.tasks_by_worker(worker)
        else:
            candidates = reversed(self.state.tasks.values())
        out: list[dict[str, Any]] = []
        matched = 0
        for task in candidates:
            if (state and task.state != state) or (name and task.name != name) \
                    or (worker and task.worker != worker):
                continue
            matched += 1
            if len(out) < limit:
                out.append(task_summary(task))
        return JSON({"tasks": out, "matched": matched, "total": len(self.state.tasks)})

    async def task(self, request: Request) -> Response:
        task = self.state.tasks.get(request.path_params["uuid"])
        if task is None:
            return _error(404, "no such task (not seen since the dashboard started, or "
                               "evicted)")
        return JSON(task_view(task))

    async def queues(self, request: Request) -> Response:
        return JSON({"queues": await self.monitor.refresh_queues()})

    async def stats(self, request: Request) -> Response:
        m = self.monitor
        workers = m.workers()
        return JSON({
            "events": m.events_received,
            "bad_events": m.bad_events,
            "receiver_connected": m.connected,
            "tasks_in_memory": len(self.state.tasks),
            "counts": self.state.state_counts(),
            "workers": {"total": len(workers), "online": sum(w["alive"] for w in workers)},
            "throughput": m.throughput.series(),
            "finished": [{"name": n, "state": s, "count": c}
                         for (n, s), c in sorted(m.finished.items())],
            "stream_clients": len(m.hub.clients),
            "stream_clients_dropped": m.hub.dropped_total,
            "cluster": self.state.stats(),
        })

    async def beat(self, request: Request) -> Response:
        def read() -> dict[str, Any]:
            api = self.monitor.app.beat
            return {"entries": api.list(), "leader": api.leader()}

        try:
            out = await asyncio.to_thread(read)
        except CeleriacError as exc:
            out = {"entries": [], "leader": None, "error": str(exc)}
        out["leader_heard"] = self.state.beat_leader
        out["sent"] = list(self.state.beat_sent.values())
        return JSON(out)

    async def metrics(self, request: Request) -> Response:
        # within a scrape's usual timeout; a queue that cannot be read has no sample
        await self.monitor.refresh_queues(timeout=3.0)
        # Generated on the loop thread: the state is only changed here, so one scrape
        # sees one consistent state.
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


class StreamEndpoint:
    """``/api/events``: an ASGI app so the response can bound its writes (see stream)."""

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        client_addr = scope.get("client")
        peer = f"{client_addr[0]}:{client_addr[1]}" if client_addr else "?"
        hub = self.monitor.hub
        client = hub.subscribe(peer)
        first = encode("tick", self.monitor.tick_payload())
        await EventStream(hub, client, first)(scope, receive, send)


def create_app(app: Celeriac, *, state: ClusterState | None = None,
               auth: tuple[str, str] | None = None, queues: Iterable[str] = (),
               allowed_hosts: Iterable[str] | None = None,
               receive_events: bool = True, read_only: bool = False) -> Starlette:
    """The dashboard for ``app``'s cluster.

    ``state``: a ClusterState to show (and feed); a new one by default.
    ``auth``: ``(user, password)`` for HTTP basic auth on every route.
    ``queues``: queues to show besides the default one and those seen in events.
    ``allowed_hosts``: accepted ``Host`` header names (None: any).
    ``receive_events``: subscribe to the event channel while the app runs (tests that
    feed the state themselves turn it off).
    ``read_only``: refuse the actions (revoke, pool, rate limit, shutdown) and hide
    their buttons.
    """
    monitor = Monitor(app, state, queues=queues)
    actions = Actions(monitor, enabled=not read_only)
    views = Views(monitor, actions)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        await monitor.start(receive=receive_events)
        try:
            yield
        finally:
            await monitor.stop()

    routes = [
        Route("/", views.index),
        Route("/static/{name}", views.static),
        Route("/api/workers", views.workers),
        Route("/api/tasks", views.tasks),
        Route("/api/tasks/{uuid}", views.task),
        Route("/api/queues", views.queues),
        Route("/api/stats", views.stats),
        Route("/api/beat", views.beat),
        Route("/api/events", StreamEndpoint(monitor)),
        Route("/metrics", views.metrics),
        *actions.routes(),
        *DeadLetters(monitor, actions).routes(),
    ]
    web = Starlette(routes=routes, lifespan=lifespan,
                    middleware=[Middleware(SecurityMiddleware, auth=auth,
                                           allowed_hosts=allowed_hosts)])
    web.state.monitor = monitor
    web.state.actions = actions
    return web
