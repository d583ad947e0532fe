"""``SQSTransport``: celeriac's broker contract on Amazon SQS.

- **Leases are SQS's visibility timeout.** A received message is invisible to others
  for ``visibility_timeout`` seconds; while this consumer holds it (running, or
  prefetched), a renewer on its loop extends the visibility of everything it holds with
  ``ChangeMessageVisibilityBatch`` every third of the timeout, so a long task is never
  delivered twice. A dead consumer's messages come back when their visibility lapses:
  SQS does that, not another consumer's renewal (``renew_lease`` returns 0).
- **Delivery counts.** SQS counts receives (``ApproximateReceiveCount``) per message; a
  requeue, a give-back or a delay hop sends a copy and deletes the original (send first:
  a crash between leaves a duplicate, never a loss), the copy carrying the counted
  deliveries so far (``celeriac-lost``).
- **Delays** are ``DelaySeconds``, whole seconds (rounded up); past SQS's 15 minutes the
  message carries its due time and is sent again in hops of at most 15 minutes when it
  comes up early. FIFO queues have no per-message delay: their delayed messages wait
  in a standard companion queue (``publish.companion``), and a consumer of the FIFO
  queue moves them over when due.
- **No priorities** (SQS has none); FIFO within a queue as SQS keeps it.
- **Fetching.** A pass without waiting over the queues in order, then one long poll per
  queue at once; what a poll brings beyond the fetch's limit waits in this consumer
  (held, its visibility renewed) for the next fetch.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...errors import OperationalError
from ...protocol import Delivery, Message
from ..base import CONTROL_CHANNEL, Subscription
from .client import AsyncClient, batches, send_batches
from .codec import DEAD_AT, DEAD_COUNT, DEAD_QUEUE, DEAD_REASON, DUE, LOST, attr_number
from .codec import number as num_attr
from .codec import text as text_attr
from .config import DELAYED, companion
from .fanout import open_fanout
from .publish import SQSBase, route

if TYPE_CHECKING:
    from ...settings import Settings

logger = logging.getLogger("celeriac.transports.sqs")

SHORT_POLL = 0.05
"""Seconds between polls without waiting, for the last second of a fetch's timeout
(SQS's long polls wait whole seconds)."""


@dataclass(slots=True)
class Tag:
    """A received SQS message: what acking, extending and re-sending it needs."""

    queue: str
    url: str
    receipt: str
    message_id: str
    text: str
    attrs: dict[str, Any] = field(default_factory=dict)
    count: int = 1
    """This delivery's count (counted deliveries of earlier copies, plus SQS's)."""
    message: Message | None = None


class SQSTransport(SQSBase):
    def __init__(self, url: str, settings: Settings) -> None:
        super().__init__(url, settings)
        self._aio: AsyncClient | None = None
        self.pubsub = open_fanout(self.config.fanout_url, self.config.prefix or "-",
                                  settings.broker_connection_timeout)
        self._owned: dict[str, Tag] = {}
        self._pending: list[Delivery] = []
        self._polls: dict[str, asyncio.Task[None]] = {}
        self._poll_error: BaseException | None = None
        self._renewer: asyncio.Task[None] | None = None
        self._extended = 0.0
        self._promoted: dict[str, float] = {}
        """When each FIFO queue's companion was last looked at (loop time)."""

    # -- consumer side ------------------------------------------------------------------
    async def connect(self, consumer_id: str) -> None:
        await super().connect(consumer_id)
        await self._client()
        if self._renewer is None:
            self._renewer = asyncio.ensure_future(self._renew_loop())

    async def _client(self) -> AsyncClient:
        if self._aio is None:
            aio = AsyncClient(self.config, self.sync.urls, self.settings.broker_connection_timeout)
            await aio.open()
            self._aio = aio
        return self._aio

    async def fetch(self, queues: Sequence[str], limit: int, timeout: float) -> list[Delivery]:
        self._raise_poll_error()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout, 0.0)
        out = self._take(queues, limit)
        while len(out) < limit:
            for queue in queues:
                if queue.endswith(".fifo") and loop.time() - self._promoted.get(queue, -1.0) >= 1:
                    # Delays are whole seconds: a look a second is enough while busy (an
                    # idle consumer long-polls the companion).
                    self._promoted[queue] = loop.time()
                    await self._promote(queue, 0)
                if len(out) < limit:
                    out += await self._receive_all(queue, limit - len(out))
            if out:
                break
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            wait = min(self.config.wait_time_seconds, math.floor(remaining))
            if wait >= 1:
                await self._long_poll(queues, limit, wait, remaining)
                out += self._take(queues, limit - len(out))
                pause = self.config.polling_interval
            else:
                pause = SHORT_POLL
            if not out:
                await asyncio.sleep(min(pause, max(deadline - loop.time(), 0.0)))
        return out

    async def wait_ready(self, queues: Sequence[str], limit: int, timeout: float
                         ) -> list[Delivery] | None:
        # The worker's idle wait: one long poll per queue of the full wait_time_seconds,
        # outliving this call (the next one waits on it), rather than a poll a second.
        self._raise_poll_error()
        if self.config.wait_time_seconds < 1:
            return await self.fetch(queues, limit, timeout)
        if not any(d.queue in queues for d in self._pending):
            await self._long_poll(queues, limit, self.config.wait_time_seconds, timeout)
        self._raise_poll_error()
        return self._take(queues, limit) or None

    def _take(self, queues: Sequence[str], limit: int) -> list[Delivery]:
        if not self._pending or limit <= 0:
            return []
        wanted = set(queues)
        out = [d for d in self._pending if d.queue in wanted][:limit]
        taken = {id(d) for d in out}
        self._pending = [d for d in self._pending if id(d) not in taken]
        return out

    async def _long_poll(self, queues: Sequence[str], limit: int, wait: int,
                         timeout: float) -> None:
        polled = [*queues, *(companion(q) for q in queues if q.endswith(".fifo"))]
        for queue in polled:
            if queue not in self._polls:
                task = asyncio.ensure_future(self._poll(queue, min(limit, 10), wait))
                self._polls[queue] = task
                task.add_done_callback(self._poll_done)
        running = [self._polls[q] for q in polled if q in self._polls]
        if running:
            await asyncio.wait(running, timeout=max(timeout, 0.0),
                               return_when=asyncio.FIRST_COMPLETED)

    def _poll_done(self, task: asyncio.Task[None]) -> None:
        for queue, running in list(self._polls.items()):
            if running is task:
                del self._polls[queue]

    async def _poll(self, queue: str, limit: int, wait: int) -> None:
        try:
            if queue.endswith(".fifo" + DELAYED):  # a FIFO queue's companion
                await self._promote(queue[:-len(DELAYED)], wait)
            else:
                self._pending += await self._receive(queue, limit, wait)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # raised by the next fetch, in the caller's loop
            self._poll_error = exc

    def _raise_poll_error(self) -> None:
        error, self._poll_error = self._poll_error, None
        if error is not None:
            raise error

    async def _promote(self, queue: str, wait: int) -> None:
        """Move the due delayed messages of the FIFO queue ``queue`` onto it (their place
        in their group's order is from now)."""
        due = await self._receive(companion(queue), 10, wait)
        if due:
            await self._resend([(d.tag, d.delivery_count - 1, 0.0, None) for d in due], queue)

    async def _receive_all(self, queue: str, limit: int) -> list[Delivery]:
        out: list[Delivery] = []
        while len(out) < limit:
            want = min(limit - len(out), 10)
            got = await self._receive(queue, want, 0)
            out += got
            if len(got) < want:
                break
        return out

    async def _receive(self, queue: str, limit: int, wait: int) -> list[Delivery]:
        aio = await self._client()
        url = await aio.url(queue)
        reply = await aio.call(
            "receive_message", f"receive from {queue}", QueueUrl=url,
            MaxNumberOfMessages=limit, WaitTimeSeconds=wait,
            VisibilityTimeout=self.config.visibility_timeout,
            AttributeNames=["ApproximateReceiveCount", "SentTimestamp"],
            MessageAttributeNames=["All"])
        out: list[Delivery] = []
        hops: list[tuple[Tag, int, float]] = []
        for raw in reply.get("Messages", []):
            attrs = raw.get("MessageAttributes") or {}
            count = int(attr_number(attrs, LOST)) + int(
                raw.get("Attributes", {}).get("ApproximateReceiveCount", 1))
            tag = Tag(queue, url, raw["ReceiptHandle"], raw["MessageId"], raw["Body"], attrs,
                      count, self.codec.decode(raw["Body"]))
            self._owned[tag.receipt] = tag
            due = attr_number(tag.attrs, DUE)
            if due and due - time.time() > 0.5:
                hops.append((tag, count - 1, due - time.time()))
                continue
            assert tag.message is not None
            out.append(Delivery(tag.message, queue, tag, count))
        if hops:
            await self._resend([(t, lost, delay, None) for t, lost, delay in hops])
        return out

    async def _resend(self, items: Sequence[tuple[Tag, int, float, dict[str, Any] | None]],
                      target: str | None = None) -> None:
        """Send a copy of each (its counted deliveries, delay, extra attributes) to its
        queue (or ``target``), then delete the originals."""
        aio = await self._client()
        by_url: dict[str, list[dict[str, Any]]] = {}
        for tag, lost, delay, extra in items:
            queue = route(target or tag.queue, delay)
            # Counted deliveries and a due time are the copy's own (``entry`` sets them).
            attrs = {k: v for k, v in tag.attrs.items() if k not in (LOST, DUE)}
            attrs.update(extra or {})
            url = await aio.url(queue)
            by_url.setdefault(url, []).append(self.entry(queue, tag.text, tag.message, lost,
                                                         delay, attrs))
        for url, entries in by_url.items():
            for batch in send_batches(entries):
                reply = await aio.call("send_message_batch", "re-send", QueueUrl=url,
                                       Entries=batch)
                if reply.get("Failed"):
                    # The originals stay (not deleted): they come back when their
                    # visibility lapses, counted.
                    raise OperationalError(f"SQS refused to re-send to {url}: "
                                           f"{reply['Failed']}")
        await self._delete([tag for tag, *_ in items])

    async def _delete(self, tags: Sequence[Tag]) -> None:
        aio = await self._client()
        by_url: dict[str, list[Tag]] = {}
        for tag in tags:
            self._owned.pop(tag.receipt, None)
            by_url.setdefault(tag.url, []).append(tag)
        for url, group in by_url.items():
            for batch in batches(group):
                reply = await aio.call(
                    "delete_message_batch", "ack", QueueUrl=url,
                    Entries=[{"Id": str(n), "ReceiptHandle": t.receipt}
                             for n, t in enumerate(batch)])
                for failed in reply.get("Failed", []):
                    # Its visibility lapsed and another consumer holds it now.
                    logger.warning("SQS did not delete a message of %s: %s", url, failed)

    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        await self._delete([d.tag for d in deliveries])

    async def requeue(self, deliveries: Sequence[Delivery], *, redelivered: bool,
                      delay: float = 0.0) -> None:
        await self._resend([(d.tag, d.delivery_count - (0 if redelivered else 1), delay, None)
                            for d in deliveries])

    async def dead_letter(self, delivery: Delivery, reason: str) -> None:
        extra = {DEAD_QUEUE: text_attr(delivery.queue), DEAD_REASON: text_attr(reason or "-"),
                 DEAD_AT: num_attr(time.time()), DEAD_COUNT: num_attr(delivery.delivery_count)}
        await self._resend([(delivery.tag, 0, 0.0, extra)], self.config.dead_letter_queue)

    # -- leases -------------------------------------------------------------------------
    async def renew_lease(self) -> int:
        await self._extend(force=False)
        return 0

    async def _renew_loop(self) -> None:
        every = self.config.visibility_timeout / 3
        outage: float | None = None
        while True:
            await asyncio.sleep(every)  # sleep-ok: the renewal's period
            try:
                await self._extend(force=True)
            except Exception as exc:
                # An outage: one line when it starts and one when it ends; the next turn
                # tries again.
                if outage is None:
                    outage = time.monotonic()
                    logger.warning("SQS visibility renewal failed (%s: %s); retrying",
                                   type(exc).__name__, exc)
                continue
            if outage is not None:
                logger.warning("SQS visibility renewal works again after %.1fs",
                               time.monotonic() - outage)
                outage = None

    async def _extend(self, *, force: bool) -> None:
        now = time.monotonic()
        if not self._owned or (not force and now - self._extended
                               < self.config.visibility_timeout / 3):
            return
        self._extended = now
        aio = await self._client()
        by_url: dict[str, list[Tag]] = {}
        for tag in list(self._owned.values()):
            by_url.setdefault(tag.url, []).append(tag)
        for url, group in by_url.items():
            for batch in batches(group):
                reply = await aio.call(
                    "change_message_visibility_batch", "extend visibility", QueueUrl=url,
                    Entries=[{"Id": str(n), "ReceiptHandle": t.receipt,
                              "VisibilityTimeout": self.config.visibility_timeout}
                             for n, t in enumerate(batch)])
                for failed in reply.get("Failed", []):
                    lost = batch[int(failed["Id"])]
                    if self._owned.pop(lost.receipt, None) is not None:
                        logger.warning("SQS message %s of %s left this consumer: %s",
                                       lost.message_id, lost.queue, failed.get("Message"))

    async def disconnect(self) -> None:
        await self._stop_tasks()
        held = list(self._owned.values())
        self._pending = []
        if held:
            # Given back uncounted: a copy keeps the deliveries counted before this one.
            await self._resend([(t, t.count - 1, 0.0, None) for t in held])
        await self.release()

    async def _stop_tasks(self) -> None:
        tasks = [*self._polls.values(), *([self._renewer] if self._renewer else [])]
        self._renewer = None
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def release(self) -> None:
        await self._stop_tasks()
        self._owned.clear()
        self._pending = []
        aio, self._aio = self._aio, None
        if aio is not None:
            await aio.close()

    # -- broadcast ----------------------------------------------------------------------
    def broadcast(self, channel: str, payload: bytes, routing_key: str = "") -> None:
        self.pubsub.publish(channel, payload)

    def has_subscribers(self, channel: str) -> bool:
        return self.pubsub.has_subscribers(channel)

    def control_listeners(self) -> int | None:
        """How many workers receive control commands now (mingle waits for that many)."""
        return self.pubsub.subscribers(CONTROL_CHANNEL)

    async def subscribe(self, channel: str) -> Subscription:
        return await self.pubsub.subscribe(channel)

    def close(self) -> None:
        self.pubsub.close()
        super().close()
