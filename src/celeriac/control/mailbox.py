"""The mailbox: what a remote-control command and its replies look like on the wire.

A command is kombu pidbox's message body (what Celery's ``app.control`` sends), as JSON
on the transport's broadcast channel ``celeriac.control``::

    {"method": "ping", "arguments": {}, "destination": ["w1@host"] | null,
     "pattern": null, "matcher": null, "ticket": "<uuid>",
     "reply_to": {"exchange": "celeriac.reply", "routing_key": "<ticket>"} | null,
     "timestamp": 1700000000.0, "signature": "<hex>"}

Each worker that the destination (or pattern) names answers ``{hostname: reply}`` on the
reply channel of the ticket, ``celeriac.reply.<ticket>`` (``REPLY_PREFIX``): one channel
per call, subscribed by the caller before it sends the command, and gone when it stops
listening (a Redis pub/sub channel; on RabbitMQ one direct exchange, ``celeriac.reply``,
routes by the ticket to the caller's exclusive queue; memory and SQLite drop the
channel's leftovers when its subscriber closes). Nothing stays in the broker.

Signing. With ``control_signing_key`` set, the sender adds ``timestamp`` and
``signature`` = HMAC-SHA256(key, canonical JSON of every other field, keys sorted), and
a worker with the key refuses a command that is unsigned, badly signed, older than
``control_max_age`` seconds (or that far in the future), or whose ticket it has already
seen within that window (a replay).
"""

from __future__ import annotations

import hashlib
import hmac
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..errors import ControlError
from ..transports.base import CONTROL_CHANNEL as CONTROL_CHANNEL
from ..transports.base import PRIVATE_PREFIX
from ..transports.base import REPLY_EXCHANGE as REPLY_EXCHANGE

REPLY_PREFIX = PRIVATE_PREFIX
"""A reply channel is this prefix plus the call's ticket (a private channel)."""
MAX_TICKETS = 10_000
"""Tickets a worker remembers against replays (within ``control_max_age``)."""


def new_ticket() -> str:
    return uuid.uuid4().hex


def reply_channel(ticket: str) -> str:
    return REPLY_PREFIX + ticket


@dataclass(slots=True)
class Command:
    """One command as a worker reads it."""

    method: str
    arguments: dict[str, Any] = field(default_factory=dict)
    destination: list[str] | None = None
    pattern: str | None = None
    matcher: str | None = None
    ticket: str | None = None
    reply_to: dict[str, str] | None = None
    timestamp: float | None = None
    signature: str | None = None

    @property
    def reply_channel(self) -> str | None:
        """Where the replies go, or None when the sender wants none."""
        if not self.reply_to:
            return None
        key = self.reply_to.get("routing_key") or self.ticket
        return reply_channel(key) if key else None


def encode_command(method: str, arguments: Mapping[str, Any] | None = None, *,
                   destination: Sequence[str] | None = None, ticket: str | None = None,
                   reply: bool = False, pattern: str | None = None,
                   matcher: str | None = None, signing_key: str | None = None,
                   now: float | None = None, reply_exchange: str = REPLY_EXCHANGE) -> bytes:
    """The command's bytes; signed when ``signing_key`` is given. ``reply_exchange``:
    what ``reply_to`` names (Celery's on the compatibility layout: ``compat/pidbox.py``)."""
    ticket = ticket or new_ticket()
    body: dict[str, Any] = {
        "method": method,
        "arguments": dict(arguments or {}),
        "destination": list(destination) if destination else None,
        "pattern": pattern,
        "matcher": matcher,
        "ticket": ticket,
        "reply_to": {"exchange": reply_exchange, "routing_key": ticket} if reply else None,
        "timestamp": time.time() if now is None else now,
    }
    if signing_key:
        body["signature"] = sign(signing_key, body)
    return orjson.dumps(body)


def decode_command(payload: bytes) -> Command:
    """Parse a command; ``ControlError`` names what is wrong with it."""
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise ControlError(f"command is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ControlError(f"command must be a JSON object, got {type(data).__name__}")
    method = data.get("method")
    if not isinstance(method, str) or not method:
        raise ControlError("command has no 'method' (a non-empty string)")
    arguments = data.get("arguments")
    arguments = {} if arguments is None else arguments
    if not isinstance(arguments, dict):
        raise ControlError(f"'arguments' of {method!r} must be an object")
    destination = data.get("destination")
    if destination is not None and (not isinstance(destination, list) or not all(
            isinstance(d, str) for d in destination)):
        raise ControlError("'destination' must be a list of node names")
    reply_to = data.get("reply_to")
    if reply_to is not None and not (isinstance(reply_to, dict) and all(
            isinstance(v, str) for v in reply_to.values())):
        raise ControlError("'reply_to' must be an object of strings")
    ticket = data.get("ticket")
    if ticket is not None and (not isinstance(ticket, str) or not _plain(ticket)):
        raise ControlError("'ticket' must be a short string of letters, digits, - and _")
    if reply_to and not _plain(reply_to.get("routing_key") or ticket or ""):
        raise ControlError("'reply_to.routing_key' must be a plain ticket")
    timestamp = data.get("timestamp")
    if timestamp is not None and not isinstance(timestamp, (int, float)):
        raise ControlError("'timestamp' must be a number")
    return Command(method, arguments, destination, _str(data, "pattern"),
                   _str(data, "matcher"), ticket, reply_to, timestamp,
                   _str(data, "signature"))


def _str(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise ControlError(f"{key!r} must be a string")
    return value


def _plain(ticket: str) -> bool:
    # A ticket names a channel (a Redis key, an AMQP routing key): nothing that could
    # reach another channel's namespace.
    return 0 < len(ticket) <= 64 and all(c.isalnum() or c in "-_" for c in ticket)


# -- signing ----------------------------------------------------------------------------
def canonical(body: Mapping[str, Any]) -> bytes:
    """The bytes a signature covers: every field but the signature, keys sorted."""
    return orjson.dumps({k: v for k, v in body.items() if k != "signature"},
                        option=orjson.OPT_SORT_KEYS)


def sign(key: str, body: Mapping[str, Any]) -> str:
    return hmac.new(key.encode(), canonical(body), hashlib.sha256).hexdigest()


class Verifier:
    """A worker's check of signed commands: signature, age, replays."""

    def __init__(self, key: str, max_age: float) -> None:
        self.key = key
        self.max_age = max_age
        self._seen: dict[str, float] = {}
        """ticket -> when it stops mattering (insertion order is time order)."""

    def check(self, command: Command, now: float | None = None) -> None:
        """Raise ``ControlError`` saying why ``command`` is refused."""
        if not command.signature:
            raise ControlError("refused: the command is not signed (this worker requires "
                               "control_signing_key)")
        body = {
            "method": command.method, "arguments": command.arguments,
            "destination": command.destination, "pattern": command.pattern,
            "matcher": command.matcher, "ticket": command.ticket,
            "reply_to": command.reply_to, "timestamp": command.timestamp,
        }
        if not hmac.compare_digest(sign(self.key, body), command.signature):
            raise ControlError("refused: bad signature")
        now = time.time() if now is None else now
        if command.timestamp is None or abs(now - command.timestamp) > self.max_age:
            raise ControlError(f"refused: the command is older than control_max_age="
                               f"{self.max_age:g}s (or the clocks disagree)")
        if not command.ticket:
            raise ControlError("refused: a signed command needs a ticket")
        self._forget(now)
        if command.ticket in self._seen:
            raise ControlError("refused: ticket already used (a replay)")
        self._seen[command.ticket] = now + self.max_age

    def _forget(self, now: float) -> None:
        seen = self._seen
        while seen:
            ticket, until = next(iter(seen.items()))
            if until > now and len(seen) < MAX_TICKETS:
                return
            del seen[ticket]


def encode_reply(hostname: str, reply: Any) -> bytes:
    return orjson.dumps({hostname: reply}, default=repr)


def decode_reply(payload: bytes) -> dict[str, Any] | None:
    """A ``{hostname: reply}`` mapping, or None for something that is not one."""
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict) or len(data) != 1:
        return None
    return data


def ok(message: str) -> dict[str, str]:
    return {"ok": message}


def error(message: str) -> dict[str, str]:
    return {"error": message}
