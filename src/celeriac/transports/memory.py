"""In-process broker for unit tests and eager mode. Not durable, one process only.

Transports created with the same URL (``memory://``, ``memory://name``) share one broker,
so a producer and a worker in one process (tests) talk to each other.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..protocol import Delivery, Message
from .base import DeadLetter, Outgoing, Subscription, Transport

if TYPE_CHECKING:
    from ..settings import Settings


@dataclass
class _Record:
    id: int
    queue: str
    envelope: bytes
    """The message as published, serialized: what a consumer gets is a fresh copy, as
    from a real broker, never the producer's own (mutable) headers."""
    body: bytes
    priority: int
    deliveries: int = 0
    owner: str | None = None

    @property
    def message(self) -> Message:
        return Message.from_envelope(self.envelope, self.body)


@dataclass
class _Broker:
    lock: threading.Lock = field(default_factory=threading.Lock)
    # queue -> heap of (-priority, id, record)
    ready: dict[str, list[tuple[int, int, _Record]]] = field(default_factory=dict)
    delayed: list[tuple[float, int, _Record]] = field(default_factory=list)
    owned: dict[int, _Record] = field(default_factory=dict)
    leases: dict[str, float] = field(default_factory=dict)
    dead: list[DeadLetter] = field(default_factory=list)
    waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = field(
        default_factory=set
    )
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    subscribers: dict[str, set[_MemorySubscription]] = field(default_factory=dict)

    def push(self, record: _Record) -> None:
        heapq.heappush(
            self.ready.setdefault(record.queue, []),
            (-record.priority, record.id, record),
        )

    def promote(self, now: float) -> None:
        while self.delayed and self.delayed[0][0] <= now:
            self.push(heapq.heappop(self.delayed)[2])

    def notify(self) -> None:
        for loop, fut in list(self.waiters):
            loop.call_soon_threadsafe(_resolve, fut)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


_BROKERS: dict[str, _Broker] = {}
_BROKERS_LOCK = threading.Lock()


def _broker_for(url: str) -> _Broker:
    key = url.rstrip("/")
    with _BROKERS_LOCK:
        return _BROKERS.setdefault(key, _Broker())


class MemoryTransport(Transport):
    scheme = "memory"
    process_local = True

    def __init__(self, url: str, settings: Settings) -> None:
        super().__init__(url, settings)
        self.broker = _broker_for(url)

    def publish_many(self, items: Sequence[Outgoing]) -> None:
        for item in items:
            self.check_size(item.message)
        b = self.broker
        now = time.time()
        with b.lock:
            for item in items:
                m = item.message
                record = _Record(next(b.ids), item.queue, m.envelope(), m.body, m.priority)
                if item.delay and item.delay > 0:
                    heapq.heappush(b.delayed, (now + item.delay, record.id, record))
                else:
                    b.push(record)
            b.notify()

    async def connect(self, consumer_id: str) -> None:
        await super().connect(consumer_id)
        await self.renew_lease()

    async def fetch(self, queues: Sequence[str], limit: int, timeout: float) -> list[Delivery]:
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout
        b = self.broker
        while True:
            fut: asyncio.Future[None] = loop.create_future()
            with b.lock:
                b.promote(time.time())
                out = self._take(queues, limit)
                if out:
                    return out
                next_eta = b.delayed[0][0] if b.delayed else None
                b.waiters.add((loop, fut))
            try:
                wait = deadline - time.monotonic()
                if next_eta is not None:
                    wait = min(wait, next_eta - time.time())
                if deadline - time.monotonic() <= 0:
                    return []
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a
                # cancellation that lands as the future completes (shutdown would hang).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(wait, 0.0)):
                        await fut
            finally:
                with b.lock:
                    b.waiters.discard((loop, fut))

    def _take(self, queues: Sequence[str], limit: int) -> list[Delivery]:
        b = self.broker
        out: list[Delivery] = []
        while len(out) < limit:
            # Highest priority head among the queues; ties go to the oldest message.
            heads = [(h[0][0], h[0][1], q) for q in queues if (h := b.ready.get(q))]
            if not heads:
                break
            queue = min(heads)[2]
            record = heapq.heappop(b.ready[queue])[2]
            record.deliveries += 1
            record.owner = self.consumer_id
            b.owned[record.id] = record
            out.append(Delivery(record.message, record.queue, record.id, record.deliveries))
        return out

    def _owned(self, delivery: Delivery) -> _Record | None:
        record = self.broker.owned.get(delivery.tag)
        return record if record is not None and record.owner == self.consumer_id else None

    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        with self.broker.lock:
            for d in deliveries:
                if self._owned(d):
                    del self.broker.owned[d.tag]

    async def requeue(self, deliveries: Sequence[Delivery], *, redelivered: bool,
                      delay: float = 0.0) -> None:
        b = self.broker
        now = time.time()
        with b.lock:
            for d in deliveries:
                record = self._owned(d)
                if record is None:
                    continue
                del b.owned[d.tag]
                record.owner = None
                if not redelivered:
                    record.deliveries -= 1
                if delay > 0:
                    heapq.heappush(b.delayed, (now + delay, record.id, record))
                else:
                    b.push(record)
            b.notify()

    async def dead_letter(self, delivery: Delivery, reason: str) -> None:
        b = self.broker
        with b.lock:
            record = self._owned(delivery)
            if record is not None:
                del b.owned[delivery.tag]
                b.dead.append(DeadLetter(record.id, record.queue, reason, record.message,
                                         record.deliveries, time.time()))

    async def renew_lease(self) -> int:
        b = self.broker
        now = time.time()
        restored = 0
        with b.lock:
            assert self.consumer_id is not None
            b.leases[self.consumer_id] = now + self.settings.worker_lease_timeout
            dead = {c for c, expires in b.leases.items() if expires < now}
            for c in dead:
                del b.leases[c]
            for rid, record in list(b.owned.items()):
                if record.owner not in b.leases:
                    del b.owned[rid]
                    record.owner = None
                    b.push(record)
                    restored += 1
            if restored:
                b.notify()
        return restored

    async def disconnect(self) -> None:
        b = self.broker
        with b.lock:
            for rid, record in list(b.owned.items()):
                if record.owner == self.consumer_id:
                    del b.owned[rid]
                    record.owner = None
                    record.deliveries -= 1
                    b.push(record)
            if self.consumer_id is not None:
                b.leases.pop(self.consumer_id, None)
            b.notify()

    def queue_length(self, queue: str) -> int:
        with self.broker.lock:
            return len(self.broker.ready.get(queue, ()))

    def purge(self, queue: str) -> int:
        b = self.broker
        with b.lock:
            n = len(b.ready.pop(queue, ()))
            kept = [e for e in b.delayed if e[2].queue != queue]
            n += len(b.delayed) - len(kept)
            b.delayed = kept
            heapq.heapify(b.delayed)
            return n

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        with self.broker.lock:
            return list(self.broker.dead[:limit])

    def requeue_dead(self, ids: Sequence[int | str]) -> int:
        b = self.broker
        wanted = set(ids)
        with b.lock:
            moving = [d for d in b.dead if d.id in wanted]
            b.dead = [d for d in b.dead if d.id not in wanted]
            for d in moving:
                m = d.message
                b.push(_Record(next(b.ids), d.queue, m.envelope(), m.body, m.priority))
            if moving:
                b.notify()
        return len(moving)

    def purge_dead(self, ids: Sequence[int | str] | None = None) -> int:
        b = self.broker
        with b.lock:
            before = len(b.dead)
            b.dead = [] if ids is None else [d for d in b.dead if d.id not in set(ids)]
            return before - len(b.dead)

    def broadcast(self, channel: str, payload: bytes, routing_key: str = "") -> None:
        with self.broker.lock:
            subscribers = list(self.broker.subscribers.get(channel, ()))
        for s in subscribers:
            s.put(payload)

    async def subscribe(self, channel: str) -> Subscription:
        sub = _MemorySubscription(self.broker, channel, asyncio.get_running_loop())
        with self.broker.lock:
            self.broker.subscribers.setdefault(channel, set()).add(sub)
        return sub


class _MemorySubscription(Subscription):
    def __init__(self, broker: _Broker, channel: str, loop: asyncio.AbstractEventLoop) -> None:
        self.broker = broker
        self.channel = channel
        self.loop = loop
        self.items: collections.deque[bytes] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None

    def put(self, payload: bytes) -> None:
        self.items.append(payload)
        try:
            self.loop.call_soon_threadsafe(self._wake)
        except RuntimeError:
            # Its loop is closed: the subscriber is gone without closing; forget it
            # rather than fail the broadcast for every other subscriber.
            with self.broker.lock:
                self.broker.subscribers.get(self.channel, set()).discard(self)

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def get(self, timeout: float) -> bytes | None:
        # A loop, not one wait: a wake-up scheduled for a payload that an earlier get()
        # already took can resolve this waiter with nothing there, and returning None
        # then would end a caller's wait (a control call's gathering) before its timeout.
        deadline = self.loop.time() + timeout
        while not self.items:
            remaining = deadline - self.loop.time()
            if remaining <= 0:
                return None
            self.waiter = self.loop.create_future()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self.waiter
            self.waiter = None
        return self.items.popleft()

    async def close(self) -> None:
        with self.broker.lock:
            subscribers = self.broker.subscribers.get(self.channel)
            if subscribers is not None:
                subscribers.discard(self)
                if not subscribers:  # per-call reply channels must not pile up
                    del self.broker.subscribers[self.channel]
