"""How a ``Message`` travels in an SQS message, and what celeriac keeps beside it.

celeriac's layout: the body is ``base64(envelope) "." base64(body)`` (SQS bodies are text;
the envelope is ``Message.envelope()``, JSON). Message attributes carry what the broker
must know without decoding the body:

- ``celeriac-lost``: the counted deliveries of earlier copies (a requeue sends a copy:
  SQS's own ``ApproximateReceiveCount`` starts again at 1 for it);
- ``celeriac-due``: when a delay longer than SQS's 15 minutes is due (the hops);
- on dead letters, ``celeriac-queue``, ``celeriac-reason``, ``celeriac-dead-at`` and
  ``celeriac-deliveries``.

kombu's layout (``compat/sqs_broker.py``) replaces ``encode``/``decode``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from ...errors import DecodeError
from ...protocol import DECODE_ERROR_HEADER, Message

LOST = "celeriac-lost"
DUE = "celeriac-due"
DEAD_QUEUE = "celeriac-queue"
DEAD_REASON = "celeriac-reason"
DEAD_AT = "celeriac-dead-at"
DEAD_COUNT = "celeriac-deliveries"


class Codec:
    """celeriac's layout (the module's docstring)."""

    def encode(self, message: Message, queue: str) -> str:
        return (base64.b64encode(message.envelope()).decode("ascii") + "."
                + base64.b64encode(message.body).decode("ascii"))

    def decode(self, text: str) -> Message:
        """The message in ``text``; one that cannot be decoded comes back with the
        ``DECODE_ERROR_HEADER`` and its raw text, for the consumer to dead-letter."""
        try:
            envelope, _, body = text.partition(".")
            return Message.from_envelope(base64.b64decode(envelope, validate=True),
                                         base64.b64decode(body, validate=True))
        except (DecodeError, binascii.Error, ValueError) as exc:
            return Message({DECODE_ERROR_HEADER: f"malformed SQS message: {exc}"},
                           text.encode(), "application/data")



def number(value: float) -> dict[str, str]:
    return {"DataType": "Number", "StringValue": repr(value) if isinstance(value, float)
            else str(value)}


def text(value: str) -> dict[str, str]:
    return {"DataType": "String", "StringValue": value}


def attr(attrs: Mapping[str, Any], name: str, default: str = "") -> str:
    """A message attribute's value as text (SQS gives ``{"StringValue": ...}``)."""
    got = attrs.get(name)
    return str(got.get("StringValue", default)) if isinstance(got, Mapping) else default


def attr_number(attrs: Mapping[str, Any], name: str, default: float = 0.0) -> float:
    try:
        return float(attr(attrs, name) or default)
    except ValueError:
        return default
