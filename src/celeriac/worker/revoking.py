"""What a task revoked while it ran leaves behind, as Celery's worker leaves it.

Celery marks a terminated task ``REVOKED`` and, when it was part of a chord's header,
counts its part (``on_chord_part_return`` with the revoked state), so the chord's body
fails with ``ChordError`` naming it rather than waiting for ever. The rest of a chain is
not run and nothing is stored for it; errbacks are not called. ``revoked_part`` is that
count: it decodes the body (only for a message with a ``group`` header; the main process
reads headers only otherwise) to find the chord its task belongs to: for a task
terminated while it ran (``revoked_part``, from the pools' ``revoked_outcome``) and for
one revoked before it ran (``revoked_on_arrival``, on a thread of the consumer's).

A message revoked on arrival is acknowledged only once its part is counted: a worker
that dies in between leaves it unacknowledged, so it comes again (the revoked ids are in
the shared store) and is counted then, once (``chord_part`` is idempotent per task id).
A count that fails (the result backend out of reach) gives the message back after
``RECOUNT_DELAY`` seconds, to be counted later, rather than acknowledge it uncounted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import serialization, states
from ..canvas import followups
from ..protocol import decode_body
from ..runtime.request import Request
from ..serialization import compression

if TYPE_CHECKING:
    from ..app import Celeriac
    from ..backends.base import Stored
    from ..protocol import Delivery, Message
    from ..transports.base import Transport
    from .execute import Job

logger = logging.getLogger("celeriac.worker.revoking")

RECOUNT_DELAY = 5.0
"""Seconds a header task's message waits in the delay store when its revoked part could
not be counted, before it comes again to be counted."""


def chord_of(app: Celeriac, headers: dict[str, Any], body: bytes, content_type: str
             ) -> dict[str, Any] | None:
    """The body of the chord whose header this message's task is in; None if it is not."""
    if not headers.get("group"):
        return None
    try:
        packed = headers.get(compression.HEADER)
        if packed is not None:
            body = compression.decompress(body, packed, app.settings.max_message_size)
        accept = serialization.accepted_content_types(app.settings.accept_content)
        embed = decode_body(serialization.loads(body, content_type, accept))[2]
    except Exception as exc:  # a body the task could not have run with either
        logger.warning("Task %s[%s] revoked: its body cannot be read (%s); no chord part "
                       "counted", headers["task"], headers["id"], exc)
        return None
    chord = (embed or {}).get("chord")
    return chord if isinstance(chord, dict) else None


def _count(app: Celeriac, headers: dict[str, Any], chord: dict[str, Any], stored: Stored
           ) -> bool:
    request = Request(id=headers["id"], task=headers["task"], group=headers["group"],
                      root_id=headers.get("root_id"), parent_id=headers.get("parent_id"),
                      headers=headers, group_index=headers.get("group_index"),
                      called_directly=False)
    try:
        followups.chord_part(app, request, stored, chord)
    except Exception:
        logger.exception("Task %s[%s] revoked: could not count its part of chord %s",
                         headers["task"], headers["id"], headers["group"])
        return False
    return True


async def revoked_on_arrival(app: Celeriac, transport: Transport, d: Delivery, reason: str,
                             ack: Callable[[Delivery], object]) -> None:
    """Count the part of a header task revoked before it ran (on a thread: it decodes the
    body and writes the result backend), then acknowledge its message (``ack``, the
    consumer's: at its next turn); if the count fails, give the message back for
    ``RECOUNT_DELAY`` seconds instead."""
    if await asyncio.to_thread(count_on_arrival, app, d.message, reason):
        ack(d)
        return
    headers = d.message.headers
    logger.warning("Task %s[%s] revoked: its chord part could not be counted; its message "
                   "goes back for %.0fs, to be counted then", headers["task"], headers["id"],
                   RECOUNT_DELAY)
    await transport.requeue([d], redelivered=False, delay=RECOUNT_DELAY)


def count_on_arrival(app: Celeriac, message: Message, reason: str) -> bool:
    """Count the part of a header task revoked before it ran, its ``REVOKED`` result
    stored with the count: True once counted, or when there is nothing to count; False
    if the count failed (logged)."""
    headers = message.headers
    chord = chord_of(app, headers, message.body, message.content_type)
    if chord is None or headers.get("ignore_result"):
        return True
    stored = app.backend.encode(headers["id"], states.REVOKED, {
        "exc_type": "TaskRevoked", "exc_module": "celeriac.errors", "exc_message": [reason]})
    return _count(app, headers, chord, stored)


def revoked_part(app: Celeriac, job: Job, stored: Stored) -> bool:
    """Count a revoked header task's part of its chord (its ``REVOKED`` result stored
    with the count); True if counted, so the caller must not store ``stored`` again."""
    chord = chord_of(app, job.headers, job.body, job.content_type)
    return chord is not None and _count(app, job.headers, chord, stored)


__all__ = ["RECOUNT_DELAY", "chord_of", "count_on_arrival", "revoked_on_arrival",
           "revoked_part"]
