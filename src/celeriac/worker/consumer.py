"""The Consumer: takes messages from the broker and feeds them to the pool.

It keeps at most ``prefetch_limit`` messages in hand (running + reserved). It reads only
headers: a message that is malformed, for an unknown task, expired, or lost too many
times is settled here without ever reaching the pool. Acks from completed jobs are
batched: every completion in one loop iteration goes out in one transport call.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import deque
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from .. import states
from ..errors import WorkerLostError
from ..protocol import Delivery, parse_time, utcnow, validate_headers
from .execute import Job, Outcome

if TYPE_CHECKING:
    from ..transports.base import Transport
    from . import Worker
    from .pool.base import Pool

logger = logging.getLogger("celeriac.worker.consumer")

FETCH_TIMEOUT = 1.0


def backoff(attempt: int, base: float = 0.2, cap: float = 10.0) -> float:
    """Exponential backoff with full jitter: uniform in [0, min(cap, base * 2**attempt))."""
    return random.uniform(0, min(cap, base * 2 ** min(attempt, 16))) + 0.05


class Consumer:
    def __init__(self, worker: Worker, transport: Transport, pool: Pool) -> None:
        self.worker = worker
        self.app = worker.app
        self.transport = transport
        self.pool = pool
        self.queues = worker.queues
        self.reserved: deque[Job] = deque()
        self.deliveries: dict[int, Delivery] = {}  # job id -> delivery, until settled
        self._next_job = 0
        self._to_ack: list[Delivery] = []
        self._capacity = asyncio.Event()
        self._pending: set[asyncio.Task[Any]] = set()
        self._fetcher: asyncio.Task[None] | None = None
        self.processed = 0

    @property
    def prefetch_limit(self) -> int:
        # Follows the pool's size as it grows and shrinks (autoscale).
        return self.pool.concurrency * self.app.settings.worker_prefetch_multiplier

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self.pool.on_ready = self._dispatch
        self.loop = asyncio.get_running_loop()
        self._fetcher = self.loop.create_task(self._fetch_loop())

    async def stop_fetching(self) -> None:
        if self._fetcher is not None:
            self._fetcher.cancel()
            await asyncio.gather(self._fetcher, return_exceptions=True)
            self._fetcher = None

    async def give_back_reserved(self) -> int:
        """Return prefetched messages that never started; their delivery is not counted."""
        jobs = list(self.reserved)
        self.reserved.clear()
        if jobs:
            await self.transport.requeue([self.deliveries.pop(j.id) for j in jobs],
                                         redelivered=False)
        return len(jobs)

    async def flush(self) -> None:
        self._flush_acks()
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    # -- fetching -----------------------------------------------------------------------
    async def _fetch_loop(self) -> None:
        failures = 0
        while True:
            budget = self.prefetch_limit - len(self.deliveries)
            if budget <= 0:
                self._capacity.clear()
                await self._capacity.wait()
                continue
            try:
                batch = await self.transport.fetch(self.queues, budget, FETCH_TIMEOUT)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # The broker went away: back off (exponential, with jitter so a fleet of
                # workers does not reconnect in lockstep) and try again, for as long as
                # the worker runs. Messages in hand keep running; their acks may fail
                # and the broker redelivers them (at least once).
                failures += 1
                delay = backoff(failures)
                logger.error("fetching from the broker failed (%s: %s); retry %d in %.1fs",
                             type(exc).__name__, exc, failures, delay)
                await asyncio.sleep(delay)
                continue
            if failures:
                logger.warning("broker connection restored after %d failed attempt(s)",
                               failures)
                failures = 0
            for delivery in batch:
                self._on_delivery(delivery)
            self._dispatch()

    def _on_delivery(self, d: Delivery) -> None:
        headers = d.message.headers
        reason = validate_headers(headers)
        if reason is not None:
            return self._dead_letter(d, f"malformed message: {reason}")
        name, task_id = headers["task"], headers["id"]
        if name not in self.app.tasks:
            return self._dead_letter(d, f"unknown task {name!r}", task_id)
        losses = d.delivery_count - 1
        if losses >= self.app.settings.task_max_deliveries:
            reason = (f"delivered {d.delivery_count} times; the worker running it was lost "
                      f"{losses} times (task_max_deliveries="
                      f"{self.app.settings.task_max_deliveries})")
            self._store(task_id, states.FAILURE, WorkerLostError(reason))
            return self._dead_letter(d, reason, task_id)
        now = utcnow()
        expires = parse_time(headers.get("expires"))
        if expires is not None and expires <= now:
            logger.info("Task %s[%s] expired at %s; revoked", name, task_id, expires)
            self._store(task_id, states.REVOKED, {"exc_type": "TaskRevoked",
                        "exc_module": "celeriac.errors", "exc_message": ["expired"]})
            return self._settle(d, self.transport.ack([d]))
        eta = parse_time(headers.get("eta"))
        if eta is not None and (delay := (eta - now).total_seconds()) > 0.001:
            # A producer that sets eta without using the broker's delay store (a Celery
            # client): park it in the store rather than in this worker's memory.
            self.transport.publish(d.queue, d.message, delay=delay)
            return self._settle(d, self.transport.ack([d]))
        self._next_job += 1
        job = Job(self._next_job, headers, d.message.body, d.message.content_type, d.queue,
                  d.delivery_count, self.worker.hostname)
        self.deliveries[job.id] = d
        self.reserved.append(job)
        return None

    def _dispatch(self) -> None:
        while self.reserved and self.pool.free_slots() > 0:
            job = self.reserved.popleft()
            task = self.app.tasks[job.headers["task"]]
            if not task.acks_late:
                # At-most-once: the message is gone before the task runs.
                self._to_ack.append(self.deliveries[job.id])
                self._schedule_flush()
            self.pool.submit(job)

    # -- completion ---------------------------------------------------------------------
    def on_job_done(self, job: Job, outcome: Outcome) -> None:
        self.processed += 1
        delivery = self.deliveries.pop(job.id, None)
        task = self.app.tasks.get(job.headers["task"])
        if delivery is not None:
            if outcome.action == "dead_letter":
                self._dead_letter(delivery, outcome.reason or "rejected",
                                  job.headers["id"], log=False)
            elif outcome.action == "requeue":
                self._spawn(self.transport.requeue([delivery], redelivered=True))
            elif task is None or task.acks_late:
                self._to_ack.append(delivery)
                self._schedule_flush()
        self._dispatch()
        self._capacity.set()

    def _schedule_flush(self) -> None:
        if len(self._to_ack) == 1:
            self.loop.call_soon(self._flush_acks)

    def _flush_acks(self) -> None:
        if self._to_ack:
            batch, self._to_ack = self._to_ack, []
            self._spawn(self.transport.ack(batch))

    def _dead_letter(self, d: Delivery, reason: str, task_id: str | None = None,
                     log: bool = True) -> None:
        if log:
            logger.error("dead-lettered message %s from queue %r: %s",
                         task_id or "(no id)", d.queue, reason)
        self._settle(d, self.transport.dead_letter(d, reason))

    def _settle(self, d: Delivery, op: Coroutine[Any, Any, None]) -> None:
        self._spawn(op)
        self._capacity.set()

    def _spawn(self, op: Coroutine[Any, Any, Any]) -> None:
        task = self.loop.create_task(op)
        self._pending.add(task)
        task.add_done_callback(self._op_done)

    def _op_done(self, task: asyncio.Task[Any]) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("broker operation failed", exc_info=task.exception())

    def _store(self, task_id: str, state: str, result: Any) -> None:
        try:
            self.app.backend.store(task_id, state, result)
        except Exception:
            logger.exception("Task [%s] could not store state %s", task_id, state)
