"""Amazon SQS in kombu's layout (``sqs://...?layout=kombu``): ``SQSTransport`` with
kombu's message body, so Celery's and celeriac's workers and producers share queues.

kombu's SQS transport (``kombu/transport/SQS.py``) names a queue as celeriac does
(``queue_name_prefix`` + the name, "." as "-" but a ``.fifo`` suffix), and sends as an
SQS message body the base64 of kombu's JSON envelope (``kombu_wire.envelope``: body
base64, headers, properties with ``delivery_info``); it reads plain JSON too. On FIFO
queues a Celery producer's group is its message's ``MessageGroupId`` property
(``"default"`` without one); celeriac's is what ``fifo_group`` says. Consumers of either
kind honour both: the group is SQS's.

A countdown goes as SQS's ``DelaySeconds`` (kombu's SQS honours it too) with Celery's
``eta`` header; to a FIFO queue, which has no per-message delay, a producer's goes out
at once with the header, as Celery sends it (``publish_many``).

What stays celeriac's: the ``celeriac-lost`` message attribute counting deliveries (kombu
ignores message attributes it did not ask for), the dead-letter queue, and broadcasts
through the shared store's Redis: Celery on SQS has no events or remote control, so no
Celery process reads them anyway.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime

from ..protocol import DECODE_ERROR_HEADER, Message
from ..settings import Settings
from ..transports.base import Outgoing
from ..transports.sqs.codec import Codec
from ..transports.sqs.transport import SQSTransport
from . import kombu_wire as kw


class KombuCodec(Codec):
    """kombu's SQS body: base64 of the kombu envelope (plain JSON read too)."""

    def encode(self, message: Message, queue: str) -> str:
        return base64.b64encode(kw.envelope(queue, message)).decode("ascii")

    def decode(self, text: str) -> Message:
        raw = text.encode()
        if not raw.lstrip().startswith(b"{"):
            try:
                raw = base64.b64decode(raw, validate=True)
            except (binascii.Error, ValueError) as exc:
                return Message({DECODE_ERROR_HEADER: f"malformed kombu SQS body: {exc}"},
                               text.encode(), "application/data")
        message, _env = kw.parse(raw)
        return message


KOMBU_VISIBILITY = 1800
"""kombu's SQS ``visibility_timeout`` default: the queues this layout creates get it, so
Celery's workers (which never extend a message's visibility) keep their tasks 30
minutes, as on queues Celery creates."""


class KombuSQSTransport(SQSTransport):
    scheme = "sqs"
    codec: Codec = KombuCodec()

    def __init__(self, url: str, settings: Settings) -> None:
        super().__init__(url, settings)
        if self.config.queue_visibility is None:
            self.config = replace(self.config, queue_visibility=KOMBU_VISIBILITY)

    def publish_many(self, items: Sequence[Outgoing]) -> None:
        # A countdown carries its eta header, as Celery's does. To a FIFO queue (no
        # per-message delay) a producer's goes out at once, as Celery sends it: a Celery
        # worker holds it until due, a celeriac worker parks it in the FIFO queue's
        # companion (which only celeriac workers move).
        out = []
        for item in items:
            if item.delay and item.delay > 0:
                message = item.message
                if message.headers.get("eta") is None:
                    due = datetime.now(UTC).timestamp() + item.delay
                    message = message.with_headers(
                        eta=datetime.fromtimestamp(due, UTC).isoformat())
                producer_fifo = item.queue.endswith(".fifo") and self.consumer_id is None
                item = replace(item, message=message,
                               delay=None if producer_fifo else item.delay)
            out.append(item)
        super().publish_many(out)
