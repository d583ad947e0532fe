"""The SQS transport's administration: queue lengths, purges, and the dead-letter queue.

SQS cannot list a queue without receiving from it: the dead letters are read by
receiving them all for a short visibility, then making them visible again (those
``celeriac dead`` moves or deletes are deleted instead). Messages an SQS redrive policy
moved here carry none of our attributes: they are listed with the reason
``redrive policy``, their queue unknown until one is named.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ...errors import OperationalError
from ..base import DeadLetter
from .client import batches, error_code
from .codec import DEAD_AT, DEAD_COUNT, DEAD_QUEUE, DEAD_REASON, attr, attr_number
from .config import companion

if TYPE_CHECKING:
    from .publish import SQSBase

logger = logging.getLogger("celeriac.transports.sqs")

SCAN_VISIBILITY = 30
"""Seconds the dead letters stay hidden while one scan reads them."""
SCAN_LIMIT = 10_000
"""Dead letters read by one scan at most."""
_OURS = (DEAD_QUEUE, DEAD_REASON, DEAD_AT, DEAD_COUNT)


def queue_length(t: SQSBase, queue: str) -> int:
    url = t.sync.url(queue, create=False)
    if url is None:
        return 0
    reply = t.sync.call("get_queue_attributes", f"length of {queue}", QueueUrl=url,
                        AttributeNames=["ApproximateNumberOfMessages"])
    return int(reply["Attributes"]["ApproximateNumberOfMessages"])


def purge(t: SQSBase, queue: str) -> int:
    """Ready and delayed messages of ``queue`` (SQS counts them approximately; a purge
    also drops what was sent within the last seconds: PurgeQueue's own rule); a FIFO
    queue's delayed ones wait in its companion queue."""
    if queue.endswith(".fifo"):
        return _purge(t, queue) + _purge(t, companion(queue))
    return _purge(t, queue)


def _purge(t: SQSBase, queue: str) -> int:
    url = t.sync.url(queue, create=False)
    if url is None:
        return 0
    reply = t.sync.call("get_queue_attributes", f"purge {queue}", QueueUrl=url,
                        AttributeNames=["ApproximateNumberOfMessages",
                                        "ApproximateNumberOfMessagesDelayed"])
    count = sum(int(v) for v in reply["Attributes"].values())
    if count == 0:
        return 0  # PurgeQueue is allowed once a minute: not spent on an empty queue
    try:
        t.sync.call("purge_queue", f"purge {queue}", QueueUrl=url)
    except OperationalError as exc:
        if error_code(exc.__cause__ or exc) != "AWS.SimpleQueueService.PurgeQueueInProgress":
            raise
        # Purged less than a minute ago: delete what can be received (not the delayed).
        return sum(1 for _ in _drain(t, url, delete=True))
    return count


def _drain(t: SQSBase, url: str, *, delete: bool) -> Iterator[dict[str, Any]]:
    """Every message of ``url`` that can be received now (up to ``SCAN_LIMIT``), hidden
    for ``SCAN_VISIBILITY`` s (deleted with ``delete``)."""
    seen = 0
    while seen < SCAN_LIMIT:
        reply = t.sync.call("receive_message", "read dead letters", QueueUrl=url,
                            MaxNumberOfMessages=10, WaitTimeSeconds=0,
                            VisibilityTimeout=SCAN_VISIBILITY,
                            AttributeNames=["ApproximateReceiveCount", "SentTimestamp"],
                            MessageAttributeNames=["All"])
        got = reply.get("Messages", [])
        if not got:
            return
        seen += len(got)
        if delete:
            _delete(t, url, got)
        yield from got


def _delete(t: SQSBase, url: str, raws: list[dict[str, Any]]) -> None:
    for batch in batches(raws):
        t.sync.call("delete_message_batch", "delete dead letters", QueueUrl=url,
                    Entries=[{"Id": str(n), "ReceiptHandle": r["ReceiptHandle"]}
                             for n, r in enumerate(batch)])


def _show(t: SQSBase, url: str, raws: list[dict[str, Any]]) -> None:
    """Make scanned dead letters visible again at once."""
    for batch in batches(raws):
        t.sync.call("change_message_visibility_batch", "release dead letters", QueueUrl=url,
                    Entries=[{"Id": str(n), "ReceiptHandle": r["ReceiptHandle"],
                              "VisibilityTimeout": 0} for n, r in enumerate(batch)])


def _letter(t: SQSBase, raw: dict[str, Any]) -> DeadLetter:
    attrs = raw.get("MessageAttributes") or {}
    system = raw.get("Attributes") or {}
    ours = DEAD_QUEUE in attrs
    return DeadLetter(
        id=raw["MessageId"],
        queue=attr(attrs, DEAD_QUEUE) if ours else "",
        reason=attr(attrs, DEAD_REASON) if ours else "redrive policy",
        message=t.codec.decode(raw["Body"]),
        delivery_count=int(attr_number(attrs, DEAD_COUNT, 1)) if ours else max(
            int(system.get("ApproximateReceiveCount", 1)) - 1, 1),
        dead_at=attr_number(attrs, DEAD_AT) if ours else int(
            system.get("SentTimestamp", 0)) / 1000)


def _scan(t: SQSBase) -> tuple[str | None, list[dict[str, Any]]]:
    url = t.sync.url(t.config.dead_letter_queue, create=False)
    return url, (list(_drain(t, url, delete=False)) if url else [])


def dead_letters(t: SQSBase, limit: int = 100) -> list[DeadLetter]:
    url, raws = _scan(t)
    if url is None:
        return []
    try:
        letters = [_letter(t, r) for r in raws]
    finally:
        _show(t, url, raws)
    letters.sort(key=lambda d: (d.dead_at, str(d.id)))
    return letters[:limit]


def requeue_dead(t: SQSBase, ids: Sequence[int | str]) -> int:
    wanted = {str(i) for i in ids}
    url, raws = _scan(t)
    if url is None:
        return 0
    chosen = [r for r in raws if r["MessageId"] in wanted]
    try:
        for raw in chosen:
            attrs = raw.get("MessageAttributes") or {}
            queue = attr(attrs, DEAD_QUEUE)
            if not queue:
                logger.warning("dead letter %s came by a redrive policy: its queue is unknown "
                               "(left in %s)", raw["MessageId"], url)
                continue
            kept = {k: v for k, v in attrs.items() if k not in _OURS and k != "celeriac-lost"}
            target = t.sync.url(queue)
            assert target is not None
            t.send_entries(target, [t.entry(queue, raw["Body"], None, 0, None, kept)])
            _delete(t, url, [raw])
            raw["moved"] = True
    finally:
        _show(t, url, [r for r in raws if not r.get("moved")])
    return sum(1 for r in chosen if r.get("moved"))


def purge_dead(t: SQSBase, ids: Sequence[int | str] | None = None) -> int:
    url, raws = _scan(t)
    if url is None:
        return 0
    wanted = None if ids is None else {str(i) for i in ids}
    chosen = [r for r in raws if wanted is None or r["MessageId"] in wanted]
    try:
        _delete(t, url, chosen)
    finally:
        _show(t, url, [r for r in raws if wanted is not None and r["MessageId"] not in wanted])
    return len(chosen)
