"""The SQS transport's producer and administration side (``SQSBase``): what a process
that only sends, lists or purges needs, on botocore's synchronous client. The consumer
side (``transport.SQSTransport``) stands on it.

A message is one ``SendMessageBatch`` entry (``entry``): the body the codec makes, the
counted deliveries of earlier copies (``celeriac-lost``), ``DelaySeconds`` in whole
seconds (rounded up: never due early; past SQS's 15 minutes, the due time rides along
for the hops), and on a ``.fifo`` queue a group (``fifo_group``) and a deduplication id
of its own. Batches hold at most 10 entries and 1 MiB (``client.send_batches``).
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...errors import MessageTooLarge, OperationalError
from ...protocol import Message
from ..base import Outgoing, Transport
from .admin import dead_letters, purge, purge_dead, queue_length, requeue_dead
from .client import MAX_BYTES, SyncClient, entry_size, send_batches
from .codec import DUE, LOST, Codec
from .codec import number as num_attr
from .config import MAX_DELAY, companion, parse

if TYPE_CHECKING:
    from ...settings import Settings
    from ..base import DeadLetter


def route(queue: str, delay: float | None) -> str:
    """The queue a message for ``queue`` with ``delay`` is sent to."""
    return companion(queue) if delay and delay > 0 and queue.endswith(".fifo") else queue


class SQSBase(Transport):
    scheme = "sqs"
    codec: Codec = Codec()

    def __init__(self, url: str, settings: Settings) -> None:
        super().__init__(url, settings)
        self.config = parse(url, settings)
        self._sync: SyncClient | None = None

    @property
    def sync(self) -> SyncClient:
        if self._sync is None:
            self._sync = SyncClient(self.config, self.settings.broker_connection_timeout)
        return self._sync

    # -- producer side ------------------------------------------------------------------
    def publish_many(self, items: Sequence[Outgoing]) -> None:
        for item in items:
            self.check_size(item.message)
        by_queue: dict[str, list[Outgoing]] = {}
        for item in items:
            by_queue.setdefault(route(item.queue, item.delay), []).append(item)
        # Every message encoded and checked before the first is sent: one too large for
        # SQS publishes nothing.
        encoded = {queue: [self.entry(queue, self.codec.encode(i.message, i.queue), i.message,
                                      0, i.delay) for i in group]
                   for queue, group in by_queue.items()}
        for queue, entries in encoded.items():
            for entry in entries:
                if entry_size(entry) > MAX_BYTES:
                    raise MessageTooLarge(
                        f"a message for queue {queue!r} is {entry_size(entry)} bytes encoded, "
                        f"over SQS's {MAX_BYTES}; nothing was published")
        for queue, entries in encoded.items():
            url = self.sync.url(queue)
            assert url is not None
            self.send_entries(url, entries)

    def entry(self, queue: str, body: str, message: Message | None, lost: int,
              delay: float | None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """One ``SendMessageBatch`` entry (its ``Id`` set by the sender)."""
        attrs: dict[str, Any] = dict(extra or {})
        if lost:
            attrs[LOST] = num_attr(lost)
        entry: dict[str, Any] = {"MessageBody": body}
        if queue.endswith(".fifo"):
            entry["MessageGroupId"] = self._group(queue, message)
            entry["MessageDeduplicationId"] = uuid.uuid4().hex
        elif delay and delay > 0:
            seconds = math.ceil(delay)  # never due before its time
            if seconds > MAX_DELAY:
                attrs[DUE] = num_attr(time.time() + delay)
            entry["DelaySeconds"] = min(seconds, MAX_DELAY)
        if attrs:
            entry["MessageAttributes"] = attrs
        return entry

    def _group(self, queue: str, message: Message | None) -> str:
        headers = message.headers if message is not None else {}
        if self.config.fifo_group == "task" and headers.get("task"):
            return str(headers["task"])
        if self.config.fifo_group == "id" and headers.get("id"):
            return str(headers["id"])
        return queue

    def send_entries(self, url: str, entries: list[dict[str, Any]]) -> None:
        for numbered in send_batches(entries):
            for _attempt in range(3):
                reply = self.sync.call("send_message_batch", "publish", QueueUrl=url,
                                       Entries=numbered)
                failed = {f["Id"] for f in reply.get("Failed", [])}
                if not failed:
                    break
                numbered = [e for e in numbered if e["Id"] in failed]
            else:
                raise OperationalError(f"SQS refused {len(numbered)} message(s) to {url}: "
                                       f"{reply.get('Failed')}")

    # -- administration -----------------------------------------------------------------
    def ping(self) -> None:
        # With predefined queues the IAM policy may grant nothing but those queues.
        for url in self.config.predefined.values():
            self.sync.call("get_queue_attributes", "ping", QueueUrl=url,
                           AttributeNames=["QueueArn"])
            return
        self.sync.call("list_queues", "ping", MaxResults=1)

    def queue_length(self, queue: str) -> int:
        return queue_length(self, queue)

    def purge(self, queue: str) -> int:
        return purge(self, queue)

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        return dead_letters(self, limit)

    def requeue_dead(self, ids: Sequence[int | str]) -> int:
        return requeue_dead(self, ids)

    def purge_dead(self, ids: Sequence[int | str] | None = None) -> int:
        return purge_dead(self, ids)

    def close(self) -> None:
        if self._sync is not None:
            self._sync.close()
