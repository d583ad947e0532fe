"""The dead-letter queue in the dashboard: list, inspect, requeue, purge.

=====================================  =====================================================
``GET /api/dead``                      the oldest dead letters first (``limit``, default
                                       100, at most ``MAX_LIMIT``): id, queue, task, task
                                       id, deliveries, reason, when; and ``total`` (up to
                                       ``MAX_LIMIT``)
``GET /api/dead/<id>``                 one, whole: headers, properties, content type and
                                       body (JSON as text; other bodies by size and type)
``POST /api/actions/dead_requeue``     ``{"ids": [...]}`` or ``{"all": true}``: back on
                                       their queues as new deliveries
``POST /api/actions/dead_purge``       ``{"ids": [...], "confirm": true}`` or ``{"all":
                                       true, "confirm": true}``: deleted for good
=====================================  =====================================================

The POSTs are actions (``actions.py``): CSRF-checked, refused with ``--read-only``, logged
with who asked. A purge must say ``"confirm": true`` (the page asks first, naming how many
go): a request that forgot cannot delete anything. The transport's calls are blocking
and run in a thread.

A broker that has no dead letters to list (a transport raising ``NotImplementedError``
or ``ConfigurationError``) answers 501, one that fails to give them 503, each with an
``error`` the page shows in place of the list: never an empty list, which would say
there are none.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import ConfigurationError, DecodeError
from ..serialization import compression
from .actions import Invalid, _error, _json

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ..protocol import Message
    from ..transports.base import DeadLetter
    from .actions import Actions
    from .monitor import Monitor

logger = logging.getLogger("celeriac.dashboard.dead")

MAX_LIMIT = 10_000
MAX_IDS = 1000
BODY_SHOWN = 64 * 1024
"""Characters of a body the inspect view shows."""


def summary(d: DeadLetter) -> dict[str, Any]:
    h = d.message.headers
    return {"id": str(d.id), "queue": d.queue, "task": h.get("task"), "task_id": h.get("id"),
            "deliveries": d.delivery_count, "reason": d.reason, "dead_at": d.dead_at}


def shown_body(m: Message, limit: int) -> str:
    """A body as text: JSON as it is (decompressed first if it can be), anything else by
    its size and type; cut at ``BODY_SHOWN`` characters."""
    body, packed = m.body, m.headers.get(compression.HEADER)
    if packed is not None:
        try:
            body = compression.decompress(body, packed, limit)
        except DecodeError as exc:
            return f"<{len(m.body)} bytes of {m.content_type}, compressed: {exc}>"
    if not m.content_type.endswith("json"):
        return f"<{len(body)} bytes of {m.content_type}>"
    text = body.decode("utf-8", "replace")
    return text if len(text) <= BODY_SHOWN else text[:BODY_SHOWN] + f"... ({len(text)} chars)"


def _ids(body: dict[str, Any]) -> list[str] | None:
    """The ``ids`` asked for; None for ``"all": true``."""
    if body.get("all") is True:
        return None
    ids = body.get("ids")
    if not isinstance(ids, list) or not ids or len(ids) > MAX_IDS or not all(
            isinstance(i, str) and 0 < len(i) <= 64 and i.isprintable() for i in ids):
        raise Invalid("ids", f"a list of 1 to {MAX_IDS} dead letter ids, or \"all\": true")
    return ids


class Unavailable(Exception):
    """The broker cannot give its dead letters: the status and the page's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _answering(fn: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
    """``fn``, its ``Unavailable`` an error the page shows (not a 500 page)."""
    async def guarded(*args: Any) -> Response:
        try:
            return await fn(*args)
        except Unavailable as exc:
            return _error(exc.status, str(exc))
    return guarded


class DeadLetters:
    """The dead-letter routes of one dashboard."""

    def __init__(self, monitor: Monitor, actions: Actions) -> None:
        self.monitor = monitor
        self.actions = actions

    @property
    def transport(self) -> Any:
        return self.monitor.app.transport

    def routes(self) -> list[Route]:
        return [Route("/api/dead", _answering(self.listing)),
                Route("/api/dead/{id}", _answering(self.show)),
                self.actions.route("dead_requeue", _answering(self.requeue)),
                self.actions.route("dead_purge", _answering(self.purge))]

    async def _broker(self, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)``, a transport's blocking dead-letter call, in a thread."""
        try:
            return await asyncio.to_thread(call, *args)
        except (NotImplementedError, ConfigurationError) as exc:
            kind = type(self.transport).__name__
            raise Unavailable(501, f"this broker ({kind}) cannot list dead letters"
                                   + (f": {exc}" if str(exc) else "")) from exc
        except Exception as exc:
            # The page says the broker failed; the traceback is for the operator's log.
            logger.warning("dead letters: %s failed: %s", getattr(call, "__name__", call),
                           exc, exc_info=True)
            raise Unavailable(503, "the broker did not give the dead letters: "
                                   f"{type(exc).__name__}: {exc}") from exc

    async def _letters(self) -> list[DeadLetter]:
        letters: list[DeadLetter] = await self._broker(self.transport.dead_letters, MAX_LIMIT)
        return letters

    async def listing(self, request: Request) -> Response:
        try:
            limit = int(request.query_params.get("limit") or 100)
        except ValueError:
            return _error(400, "limit must be an integer")
        if not 1 <= limit <= MAX_LIMIT:
            return _error(400, f"limit must be between 1 and {MAX_LIMIT}")
        letters = await self._letters()
        return _json({"dead": [summary(d) for d in letters[:limit]], "total": len(letters)})

    async def show(self, request: Request) -> Response:
        wanted = request.path_params["id"]
        letters = await self._letters()
        found = next((d for d in letters if str(d.id) == wanted), None)
        if found is None:
            return _error(404, "no such dead letter (requeued or purged?)")
        m = found.message
        return _json({**summary(found), "headers": m.headers, "properties": m.properties,
                      "content_type": m.content_type,
                      "body": shown_body(m, self.monitor.app.settings.max_message_size)})

    async def _find(self, ids: list[str] | None) -> list[int | str]:
        letters = await self._letters()
        if ids is None:
            return [d.id for d in letters]
        known = {str(d.id): d.id for d in letters}
        missing = [i for i in ids if i not in known]
        if missing:
            raise Invalid("ids", f"no dead letter {', '.join(missing[:5])} (requeued or "
                                 "purged already?)")
        return [known[i] for i in ids]

    async def requeue(self, body: dict[str, Any], who: str) -> Response:
        found = await self._find(_ids(body))
        moved = await self._broker(self.transport.requeue_dead, found) if found else 0
        logger.info("requeued %d dead letter(s), by %s", moved, who)
        return _json({"action": "dead_requeue", "ok": True, "count": moved})

    async def purge(self, body: dict[str, Any], who: str) -> Response:
        if body.get("confirm") is not True:
            raise Invalid("confirm", "must be true: a purge deletes for good")
        found = await self._find(_ids(body))
        removed = await self._broker(self.transport.purge_dead, found) if found else 0
        logger.warning("purged %d dead letter(s), by %s", removed, who)
        return _json({"action": "dead_purge", "ok": True, "count": removed})


__all__ = ["DeadLetters", "Unavailable", "shown_body", "summary"]
