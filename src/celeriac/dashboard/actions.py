"""The dashboard's actions: revoke or terminate a task, grow or shrink a pool, set a rate
limit, shut a worker down; each a ``POST /api/actions/<name>`` with a JSON body that
calls ``app.control`` and answers with the workers' replies.

=================================  ============================================================
``POST /api/actions/revoke``       ``{"task_id", "terminate": false, "signal": "SIGTERM",
                                   "worker"}`` (worker: default the one the task ran on)
``POST /api/actions/pool_grow``    ``{"worker", "n": 1}`` (and ``pool_shrink``)
``POST /api/actions/rate_limit``   ``{"task_name", "rate": "10/m", "worker"}`` (no worker:
                                   all)
``POST /api/actions/shutdown``     ``{"worker"}``
``GET /api/csrf``                  ``{"token"}``, and the cookie
``GET /api/config``                ``{"actions": bool}``: the page shows the buttons or not
=================================  ============================================================

Replies: ``{"action", "ok", "replies": {worker: reply}}`` (``ok`` is false when a worker
answered with an error), 504 when no worker replied in time, 400 naming the field at
fault, 403 with the reason when the request fails a CSRF rule or the dashboard is
``--read-only``.

CSRF. The dashboard's basic auth is sent by the browser with any request to it, whoever's
page asks, so a page on another site could make the browser POST here. An action is
refused unless all three hold:

1. ``Content-Type: application/json``. A cross-site HTML form can only send the three
   "simple" types; a cross-site ``fetch`` with JSON needs a CORS preflight, which this
   app never grants (it sends no ``Access-Control-Allow-*`` header).
2. Same origin. ``Origin``, when the browser sends it, must name the ``Host`` the request
   went to; ``Sec-Fetch-Site``, when sent, must be ``same-origin``. (Behind a proxy that
   rewrites ``Host``, have it pass the original one.)
3. A token, signed double-submit. The token is ``nonce.HMAC(secret, nonce|user)`` with a
   per-process random secret; ``/`` and ``/api/csrf`` set it in the ``celeriac_csrf``
   cookie (``SameSite=Strict``, readable by the page's script). The page sends it back in
   ``X-CSRF-Token``; the header must equal the cookie and carry a valid signature
   (compared with ``hmac.compare_digest``). Another site can neither read the cookie nor
   forge the signature, and a token issued to one basic-auth user is no good to another.
   A restart changes the secret: the page then asks ``/api/csrf`` again.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..control import merge
from ..settings.rates import parse_rate

if TYPE_CHECKING:
    from .monitor import Monitor

logger = logging.getLogger("celeriac.dashboard.actions")

COOKIE = "celeriac_csrf"
HEADER = "x-csrf-token"
SIGNALS = ("SIGTERM", "SIGKILL", "SIGINT", "SIGQUIT", "SIGHUP", "SIGUSR1", "SIGUSR2")
REPLY_TIMEOUT = 3.0
"""Seconds to wait for a worker's reply: it answers from its event loop at once, but a
polling broker (SQLite) adds its poll interval on each way."""
MAX_BODY = 16 * 1024
MAX_N = 100  # a pool change by more than this is surely a typo
MAX_NAME = 255
_DEFAULT_PORTS = {"http": "80", "https": "443"}


class Invalid(ValueError):
    """A bad field: 400 naming it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")


def _json(content: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(content, default=str), status_code=status,
                    media_type="application/json")


def _error(status: int, message: str) -> Response:
    return _json({"error": message}, status)


# -- CSRF --------------------------------------------------------------------------------
class Csrf:
    """Signed double-submit tokens (see the module docstring)."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)

    def _sign(self, nonce: str, user: str) -> str:
        message = f"{nonce}|{user}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def new_token(self, user: str | None) -> str:
        nonce = secrets.token_urlsafe(18)
        return f"{nonce}.{self._sign(nonce, user or '')}"

    def valid(self, token: str, user: str | None) -> bool:
        nonce, _, mac = token.partition(".")
        if not nonce or not mac:
            return False
        return hmac.compare_digest(mac.encode(), self._sign(nonce, user or "").encode())

    def set_cookie(self, response: Response, request: Request, token: str | None = None
                   ) -> None:
        """The token cookie on ``response``: readable by the page's script (it sends
        the token back in the header), never sent with another site's requests."""
        response.set_cookie(COOKIE, token or self.new_token(user_of(request)), path="/",
                            samesite="strict", httponly=False,
                            secure=request.url.scheme == "https")

    def refusal(self, request: Request) -> str | None:
        """Why ``request`` may not act (None: it may)."""
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/json":
            return "Content-Type must be application/json"
        site = request.headers.get("sec-fetch-site")
        if site is not None and site != "same-origin":
            return f"cross-site request refused (Sec-Fetch-Site: {site})"
        origin = request.headers.get("origin")
        if origin is not None and not same_origin(origin, request.headers.get("host", "")):
            return "cross-origin request refused (Origin does not match Host)"
        header = request.headers.get(HEADER, "")
        cookie = request.cookies.get(COOKIE, "")
        if not header:
            return "missing X-CSRF-Token header (GET api/csrf for one)"
        if not cookie or not hmac.compare_digest(header.encode(), cookie.encode()):
            return "X-CSRF-Token does not match the celeriac_csrf cookie"
        if not self.valid(header, user_of(request)):
            return "invalid CSRF token (the dashboard restarted? GET api/csrf for a new one)"
        return None


def same_origin(origin: str, host: str) -> bool:
    """Does ``Origin: scheme://host[:port]`` name the ``Host`` header's host and port?"""
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    if parts.scheme not in _DEFAULT_PORTS or not parts.netloc:
        return False  # "null" (sandboxed frames, file:) and anything else
    default = ":" + _DEFAULT_PORTS[parts.scheme]

    def norm(netloc: str) -> str:
        netloc = netloc.lower()
        return netloc[:-len(default)] if netloc.endswith(default) else netloc

    return bool(host) and norm(parts.netloc) == norm(host.strip())


def user_of(request: Request) -> str | None:
    """The basic-auth user the SecurityMiddleware let in, if any."""
    user = request.scope.get("celeriac.user")
    return user if isinstance(user, str) else None


# -- validation --------------------------------------------------------------------------
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


def _name(body: dict[str, Any], field: str, *, required: bool = True) -> str | None:
    value = body.get(field)
    if value is None or value == "":
        if required:
            raise Invalid(field, "required")
        return None
    if not isinstance(value, str) or len(value) > MAX_NAME or _CONTROL_CHARS.search(value):
        raise Invalid(field, f"must be a string of at most {MAX_NAME} printable characters")
    return value


def _count(body: dict[str, Any]) -> int:
    n = body.get("n", 1)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise Invalid("n", f"must be an integer from 1 to {MAX_N}")
    return n


def _signal(body: dict[str, Any]) -> str:
    value = body.get("signal") or "SIGTERM"
    name = value.upper() if isinstance(value, str) else ""
    name = name if name.startswith("SIG") else "SIG" + name
    if name not in SIGNALS:
        raise Invalid("signal", f"must be one of {', '.join(SIGNALS)}")
    return name


def _rate(body: dict[str, Any]) -> str:
    value = body.get("rate")
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise Invalid("rate", "required, as 10/s, 100/m, 1000/h (0: no limit)")
    try:
        parse_rate(value.strip())
    except ValueError:
        raise Invalid("rate", f"{value!r} is not a rate: use 10/s, 100/m, 1000/h "
                              "(0: no limit)") from None
    return value.strip()


# -- the routes --------------------------------------------------------------------------
class Actions:
    """The action routes for one dashboard; ``enabled`` False answers every one 403."""

    def __init__(self, monitor: Monitor, *, enabled: bool = True,
                 timeout: float = REPLY_TIMEOUT) -> None:
        self.monitor = monitor
        self.enabled = enabled
        self.timeout = timeout
        self.csrf = Csrf()

    def routes(self) -> list[Route]:
        act = {"revoke": self.revoke, "pool_grow": self.pool_grow,
               "pool_shrink": self.pool_shrink, "rate_limit": self.rate_limit,
               "shutdown": self.shutdown}
        return [Route("/api/config", self.config), Route("/api/csrf", self.token),
                *(self.route(name, fn) for name, fn in act.items())]

    def route(self, name: str, fn: Callable[[dict[str, Any], str], Any]) -> Route:
        """``POST /api/actions/<name>``: ``fn(body, who)`` behind the checks every action
        passes (read-only, CSRF, a JSON object body; ``Invalid`` is a 400)."""
        return Route(f"/api/actions/{name}", self._endpoint(name, fn), methods=["POST"])

    async def config(self, request: Request) -> Response:
        return _json({"actions": self.enabled})

    async def token(self, request: Request) -> Response:
        token = self.csrf.new_token(user_of(request))
        response = _json({"token": token})
        response.headers["cache-control"] = "no-store"
        self.csrf.set_cookie(response, request, token)
        return response

    def _endpoint(self, name: str, fn: Callable[[dict[str, Any], str], Any]
                  ) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            if not self.enabled:
                return _error(403, "the dashboard is read-only (--read-only)")
            reason = self.csrf.refusal(request)
            if reason is not None:
                logger.warning("%s refused: %s (user %s, from %s)", name, reason,
                               user_of(request) or "-", _peer(request))
                return _error(403, reason)
            raw = await request.body()
            if len(raw) > MAX_BODY:
                return _error(413, "body too large")
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError:
                return _error(400, "body: not JSON")
            if not isinstance(body, dict):
                return _error(400, "body: must be a JSON object")
            who = f"{user_of(request) or '-'} from {_peer(request)}"
            try:
                out: Response = await fn(body, who)
            except Invalid as exc:
                return _error(400, str(exc))
            return out
        return endpoint

    def _alive(self) -> list[str]:
        return [w["hostname"] for w in self.monitor.workers() if w.get("alive")]

    async def _call(self, action: str, what: str, who: str, workers: list[str] | None,
                    call: Callable[..., Any], *args: Any, **kwargs: Any) -> Response:
        """Run ``call`` (an ``app.control`` method) in a thread, replies gathered from
        ``workers`` (None: every worker, as many as are known to be alive)."""
        logger.info("%s %s, by %s", action, what, who)
        limit = len(workers) if workers else max(1, len(self._alive()))
        replies = await asyncio.to_thread(call, *args, destination=workers, reply=True,
                                          timeout=self.timeout, limit=limit, **kwargs)
        merged = merge(replies)
        if not merged:
            named = ", ".join(workers) if workers else "any worker"
            return _error(504, f"no reply from {named} within {self.timeout:g} s")
        ok = all(not (isinstance(r, dict) and "error" in r) for r in merged.values())
        if not ok:
            logger.warning("%s %s: %s", action, what, merged)
        return _json({"action": action, "ok": ok, "replies": merged})

    async def revoke(self, body: dict[str, Any], who: str) -> Response:
        task_id = _name(body, "task_id")
        assert task_id is not None
        terminate = body.get("terminate", False)
        if not isinstance(terminate, bool):
            raise Invalid("terminate", "must be true or false")
        signal = _signal(body)
        worker = _name(body, "worker", required=False)
        if worker is None:
            task = self.monitor.state.tasks.get(task_id)
            worker = task.worker if task is not None and task.worker else None
        control = self.monitor.app.control
        action = "terminate" if terminate else "revoke"
        what = f"{task_id}" + (f" with {signal}" if terminate else "") + \
            (f" on {worker}" if worker else "")
        return await self._call(action, what, who, [worker] if worker else None,
                                control.revoke, task_id, terminate=terminate,
                                signal=signal)

    async def pool_grow(self, body: dict[str, Any], who: str) -> Response:
        return await self._pool("pool_grow", body, who)

    async def pool_shrink(self, body: dict[str, Any], who: str) -> Response:
        return await self._pool("pool_shrink", body, who)

    async def _pool(self, action: str, body: dict[str, Any], who: str) -> Response:
        worker = _name(body, "worker")
        assert worker is not None
        n = _count(body)
        call = getattr(self.monitor.app.control, action)
        return await self._call(action, f"{worker} by {n}", who, [worker], call, n)

    async def rate_limit(self, body: dict[str, Any], who: str) -> Response:
        task_name = _name(body, "task_name")
        rate = _rate(body)
        worker = _name(body, "worker", required=False)
        what = f"{task_name} to {rate} on {worker or 'all workers'}"
        return await self._call("rate_limit", what, who, [worker] if worker else None,
                                self.monitor.app.control.rate_limit, task_name, rate)

    async def shutdown(self, body: dict[str, Any], who: str) -> Response:
        worker = _name(body, "worker")
        assert worker is not None
        return await self._call("shutdown", worker, who, [worker],
                                self.monitor.app.control.shutdown)


def _peer(request: Request) -> str:
    client = request.client
    return f"{client.host}:{client.port}" if client else "?"
