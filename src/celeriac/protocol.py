"""Celery's task message protocol v2, and the compact envelope around it.

A task message is headers + properties + body. The headers carry everything a worker's
parent process needs to route, account and refuse a message (task name, id, eta, expires,
retries, time limits), so the parent never decodes the body: it hands the body bytes to
the process that runs the task. The body is ``[args, kwargs, embed]`` where ``embed`` holds
``callbacks``, ``errbacks``, ``chain`` and ``chord``.

On AMQP the headers and properties map onto AMQP's own. On SQLite and Redis the
envelope is ours: one JSON object ``{"h": headers, "p": properties, "ct": content_type,
"ce": content_encoding}`` stored beside the body bytes.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from .errors import DecodeError

REQUIRED_HEADERS = ("task", "id")
DECODE_ERROR_HEADER = "x-celeriac-decode-error"
"""Set by a transport on a message whose envelope it could not decode."""


@dataclass(frozen=True, slots=True)
class Message:
    """A message as the transports carry it. ``body`` is opaque bytes."""

    headers: dict[str, Any]
    body: bytes
    content_type: str = "application/json"
    content_encoding: str = "utf-8"
    properties: dict[str, Any] = field(default_factory=dict)

    @property
    def priority(self) -> int:
        return int(self.properties.get("priority") or 0)

    def envelope(self) -> bytes:
        """Everything but the body, as one JSON document."""
        return orjson.dumps(
            {"h": self.headers, "p": self.properties, "ct": self.content_type,
             "ce": self.content_encoding}
        )

    @classmethod
    def from_envelope(cls, envelope: bytes, body: bytes) -> Message:
        try:
            env = orjson.loads(envelope)
            return cls(env["h"], body, env["ct"], env.get("ce", "utf-8"), env.get("p") or {})
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise DecodeError(f"malformed message envelope: {exc}") from exc

    def with_headers(self, **changes: Any) -> Message:
        return Message({**self.headers, **changes}, self.body, self.content_type,
                       self.content_encoding, self.properties)


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message handed to a consumer, until it is acked, rejected or dead-lettered."""

    message: Message
    queue: str
    tag: Any
    """Transport-specific handle for ack/reject."""
    delivery_count: int = 1
    """How many times the broker has handed this message out, this time included."""


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id() -> str:
    return str(uuid.uuid4())


_ORIGIN: str | None = None


def origin() -> str:
    global _ORIGIN
    if _ORIGIN is None:
        _ORIGIN = f"{os.getpid()}@{socket.gethostname()}"
    return _ORIGIN


def task_headers(
    *,
    task: str,
    task_id: str,
    args_repr: str,
    kwargs_repr: str,
    eta: datetime | None = None,
    expires: datetime | None = None,
    retries: int = 0,
    time_limit: float | None = None,
    soft_time_limit: float | None = None,
    root_id: str | None = None,
    parent_id: str | None = None,
    group: str | None = None,
    ignore_result: bool = False,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    headers: dict[str, Any] = {
        "lang": "py",
        "task": task,
        "id": task_id,
        "shadow": None,
        "eta": eta.isoformat() if eta else None,
        "expires": expires.isoformat() if expires else None,
        "group": group,
        "group_index": None,
        "retries": retries,
        "timelimit": [time_limit, soft_time_limit],
        "root_id": root_id or task_id,
        "parent_id": parent_id,
        "argsrepr": args_repr,
        "kwargsrepr": kwargs_repr,
        "origin": origin(),
        "ignore_result": ignore_result,
    }
    if extra:
        headers.update(extra)
    return headers


def task_properties(task_id: str, priority: int, reply_to: str | None = None) -> dict[str, Any]:
    return {
        "correlation_id": task_id,
        "reply_to": reply_to,
        "delivery_mode": 2,
        "priority": priority,
    }


def validate_headers(headers: Any) -> str | None:
    """The reason a header set is not a valid task message, or None."""
    if not isinstance(headers, dict):
        return "headers are not a mapping"
    if DECODE_ERROR_HEADER in headers:
        return str(headers[DECODE_ERROR_HEADER])
    for name in REQUIRED_HEADERS:
        value = headers.get(name)
        if not isinstance(value, str) or not value:
            return f"missing or invalid {name!r} header"
    retries = headers.get("retries", 0)
    if retries is not None and not isinstance(retries, int):
        return "'retries' header is not an integer"
    for name in ("eta", "expires"):
        if headers.get(name) is not None and parse_time(headers[name]) is None:
            return f"{name!r} header is not an ISO 8601 time"
    return None


def parse_time(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value, UTC)
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def decode_body(payload: Any) -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
    """Split a decoded v2 body into ``(args, kwargs, embed)``."""
    if (
        not isinstance(payload, (list, tuple))
        or len(payload) != 3
        or not isinstance(payload[0], (list, tuple))
        or not isinstance(payload[1], dict)
    ):
        raise DecodeError("body is not a protocol v2 [args, kwargs, embed] triple")
    embed = payload[2] if isinstance(payload[2], dict) else {}
    return list(payload[0]), payload[1], embed
