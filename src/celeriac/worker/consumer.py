"""The Consumer: takes messages from the broker, feeds them to the pool, settles them.

It keeps at most ``prefetch_limit`` messages in hand (reserved + running) and fetches
again only once that drops to half (the low-water mark), so that a fetch brings a batch
rather than one message per freed slot. It reads only headers: a message that is
malformed, for an unknown task, expired, or lost too many times is settled here without
ever reaching the pool.

The pump (pump.py) makes the hot path's broker calls, one at a time: it stores the
results of finished tasks, acks their messages and fetches more in one call, and sleeps
in the broker while the queues are empty. The consumer tells it how many to fetch
(``want``) and takes what comes (``ingest``).

Rate limits (ratelimit.py): a job of a limited task without a token is held in the
``RateLimiter``, outside ``reserved`` and the pool, until the Timer brings it back.
Flow control (limits.py, only for an app with such tasks): unique locks let go as jobs
start, end (once their results are stored), come back or are dropped; a ``concurrency``
task's job takes a slot in the shared store in ``_dispatch``, held there without one.
"""

from __future__ import annotations

import asyncio
import logging
import signal as signals
from collections import Counter, deque
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from .. import states
from ..errors import BrokerError, CeleriacError, ControlError, WorkerLostError
from ..protocol import Delivery, parse_time, utcnow
from .admission import Admission, Refusal, result_id
from .execute import Job, Outcome, exception_repr, received_request
from .limits import FlowControl, wanted
from .pump import Pump
from .ratelimit import RateLimiter
from .revoking import revoked_on_arrival
from .state import revoked_stamps, revoking_stamps
from .task_events import TaskEvents

if TYPE_CHECKING:
    from ..transports.base import Transport
    from . import Worker
    from .pool.base import Pool

logger = logging.getLogger("celeriac.worker.consumer")

REDELIVERY_DELAY_CAP = 60.0
"""Seconds: the longest wait of a lost message before its next delivery."""


def signal_number(name: str | int) -> int:
    """``"SIGKILL"``, ``"KILL"`` or ``9`` as a signal number; ``ControlError`` otherwise."""
    if isinstance(name, int) and not isinstance(name, bool):
        return int(signals.Signals(name))
    text = str(name).upper()
    try:
        if text.isdigit():
            return int(signals.Signals(int(text)))
        return int(signals.Signals[text if text.startswith("SIG") else f"SIG{text}"])
    except (KeyError, ValueError):
        raise ControlError(f"revoke: argument 'signal': unknown signal {name!r}") from None


class Consumer:
    def __init__(self, worker: Worker, transport: Transport, pool: Pool) -> None:
        self.worker = worker
        self.app = worker.app
        self.transport = transport
        self.pool = pool
        self.queues = worker.queues
        self.reserved: deque[Job] = deque()
        self.deliveries: dict[int, Delivery] = {}
        """Job seq -> delivery, for the messages in hand: reserved, in the pool, running."""
        self._next_seq = 0
        self.events = (TaskEvents(worker.events, self.app.settings.events_hide_args)
                       if worker.events is not None and worker.task_events else None)
        self._pending: set[asyncio.Task[Any]] = set()
        self.admission = Admission(self.app)
        # Parses every task's rate limit now: a bad one stops the worker at its start.
        self.limiter = RateLimiter(self.app, worker.timer, self._rate_due)
        self.limiter.room = lambda: pool.free_slots() + pool.queue_slots()
        # Unique locks and concurrency slots (limits.py): None without such tasks.
        self.flow = FlowControl(self.app, worker.timer, self.reserved, self._rate_due,
                                self._drop_revoked, self._skip, worker.hostname) \
            if wanted(self.app) else None
        revoked = getattr(worker, "revoked", None)
        # Revoked ids (worker/revoked.py), the same dict: tested at arrival and dispatch.
        self._revoked: dict[str, float] = revoked.ids if revoked is not None else {}
        # Revoked ids to kill as they start (revoke terminate=True found them queued).
        self._terminate: dict[str, str] = revoked.terminate if revoked is not None else {}
        self.totals: Counter[str] = Counter()  # tasks finished, by name (inspect stats)
        self._direct: tuple[str, ...] | None = None  # see _direct_settle
        self.pump = Pump(self, self.app, transport)

    @property
    def quiet(self) -> asyncio.Event:
        """Set while no broker call of the pump's is in flight."""
        return self.pump.quiet

    @property
    def prefetch_limit(self) -> int:
        # Follows the pool's size as it grows and shrinks (autoscale), and its room for
        # async tasks while they run (up to worker_child_concurrency per child).
        return self.pool.capacity() * self.app.settings.worker_prefetch_multiplier

    # -- lifecycle ------------------------------------------------------------------------
    async def bind_queues(self) -> None:
        """Make ``queues`` (the worker's list, changed in place) what this worker
        consumes: a fanout group's queue of its own, bound to the group (every worker
        gets a copy), and with ``worker_direct`` its ``<hostname>.dq``."""
        plan = self.app.routing.worker_queues(list(self.queues), self.worker.hostname)
        for queue, group in plan:
            if group is not None:
                await self.transport.bind_fanout(group, queue)
        self.queues[:] = list(dict.fromkeys(queue for queue, _ in plan))

    def start(self) -> None:
        self.pool.attach(self)
        self.loop = asyncio.get_running_loop()
        self._direct_settle()
        if self.events is not None:
            self.events.loop = self.loop
        self.pump.start(self.loop)

    def _direct_settle(self) -> None:
        """On an idle worker a pool child settles its job's message itself (``Job.settle``;
        ``_on_delivery`` decides per job), where the pool can (prefork) and the transport
        keeps the results on its own server (Redis)."""
        if getattr(self.pool, "settles_direct", False):
            self._direct = self.transport.direct_settle(self.app.backend)

    def ended(self, task: asyncio.Task[None]) -> None:
        # The pump and the sleeper handle what they expect. Anything else that ends one
        # would leave the worker alive and idle with work waiting: stop it instead, so
        # that it exits non-zero and its supervisor restarts it.
        if task.cancelled() or task.exception() is None:
            return
        self._fatal("the consumer's loop", task.exception())

    def _fatal(self, where: str, exc: BaseException | None) -> None:
        logger.critical("%s failed; stopping the worker", where, exc_info=exc)
        self.worker.fail(f"{where} failed: {type(exc).__name__}: {exc}")

    async def stop_fetching(self) -> None:
        """Fetch no more. On return, every message fetched is in ``reserved`` or running."""
        await self.pump.stop_fetching()

    async def give_back_reserved(self) -> int:
        """Return prefetched messages that never started; their delivery is not counted."""
        # Jobs held by their rate limit are prefetched messages that never started too.
        jobs = list(self.reserved) + self.limiter.drain()
        if self.flow is not None:
            jobs += self.flow.drain()
        self.reserved.clear()
        if jobs:
            await self.transport.requeue([self.deliveries.pop(j.seq) for j in jobs],
                                         redelivered=False)
            if self.flow is not None:
                self.flow.forget(jobs)  # their slots (a unique lock stays: still queued)
        return len(jobs)

    async def flush(self) -> None:
        """Settle what finished (results, acks), then stop the pump."""
        await self.pump.flush()
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)
        self.limiter.close()
        if self.flow is not None:
            await self.flow.close()

    # -- what the pump fetches, and what it brings ------------------------------------------
    def want(self, sleeping: bool = False) -> int:
        """How many messages to fetch now: 0 above the low-water mark (or while the
        sleeper waits, unless it is the one asking)."""
        pump = self.pump
        if not pump.fetching or (pump.sleeper is not None and not sleeping):
            return 0
        limit = self.prefetch_limit
        # Held rate-limited messages do not count (up to a bound): they must not stop
        # the fetches that bring other tasks' messages from behind them.
        in_hand = len(self.deliveries) - self.limiter.budget_exempt(limit)
        if self.flow is not None:
            in_hand -= self.flow.exempt(limit)  # held for a concurrency slot
        # Above the low-water mark too while a child is idle with nothing reserved for
        # it: with multiplier 1 (limit = pool size), or children the autoscaler just
        # added, waiting for half the pool to finish would leave it idle for a whole task.
        idle = in_hand < limit and not self.reserved and self.pool.free_slots()
        return limit - in_hand if in_hand <= limit // 2 or idle else 0

    def in_pool(self) -> int:
        """Jobs in the pool (running or queued behind one): what may finish soon."""
        return len(self.deliveries) - len(self.reserved) - self.limiter.held

    def ingest(self, batch: list[Delivery]) -> None:
        for delivery in batch:
            try:
                self._on_delivery(delivery)
            except Exception as exc:
                # A check missed something: this message is refused, the rest go on.
                logger.exception("could not take message from queue %r", delivery.queue)
                reason = f"the worker could not take it: {type(exc).__name__}: {exc}"
                self._refuse(delivery, Refusal(reason, CeleriacError(reason)))
        self._dispatch()

    # -- arrival ------------------------------------------------------------------------
    def _on_delivery(self, d: Delivery) -> None:
        refusal = self.admission.check(d.message)
        if refusal is not None:
            return self._refuse(d, refusal)
        # From here on every header the worker reads has been checked (admission.py).
        headers = d.message.headers
        if self.flow is not None:
            self.flow.arrived(d)  # redelivered (or dead-lettered below): its lock goes
        name, task_id = headers["task"], headers["id"]
        if self._revoked and task_id in self._revoked:
            return self._settle_revoked(d, name, task_id, "revoked")
        if revoked_stamps and "stamped_headers" in headers and revoking_stamps(headers):
            return self._settle_revoked(d, name, task_id, "revoked")  # by its stamps
        events = self.events
        losses = d.delivery_count - 1
        if losses >= self.app.settings.task_max_deliveries:
            reason = (f"delivered {d.delivery_count} times; the worker running it was lost "
                      f"{losses} times (task_max_deliveries="
                      f"{self.app.settings.task_max_deliveries})")
            logger.error("dead-lettered message %s from queue %r: %s", task_id, d.queue,
                         reason)
            exc = WorkerLostError(reason)
            self._result(task_id, states.FAILURE, exc, d)
            if events is not None:
                self.pump.final(events.failed(task_id, exception_repr(exc)))
            return self.pump.dead_letter(d, reason)
        if (headers.get("expires") is not None or headers.get("eta") is not None) \
                and self._not_now(d, name, task_id):
            return None
        self._next_seq += 1
        # The queues ran dry and fewer are in hand than children: nothing to batch its
        # settling with (a drain's fetches come back full, dense arrivals' polls carry
        # their acks), so the child settles it.
        pump = self.pump
        settle = (*self._direct, d.tag) if self._direct and pump.drained and not pump.dense \
            and len(self.deliveries) < self.pool.concurrency \
            and self.app.tasks[name].acks_late else None
        job = Job(self._next_seq, headers, d.message.body, d.message.content_type, d.queue,
                  d.delivery_count, self.worker.hostname, d.message.properties or None,
                  settle)
        self.deliveries[job.seq] = d
        self.reserved.append(job)
        if events is not None:
            events.received(headers, d.queue)
        if self.app.hooks:
            self.app.hooks.call("task_received", received_request(d, self.worker.hostname))
        return None

    def _not_now(self, d: Delivery, name: str, task_id: str) -> bool:
        """Settle a message that must not run now: expired (revoked), or due later (an
        eta set without the broker's delay store, as a Celery client does: parked in
        the store rather than in this worker's memory). True if it was."""
        headers, now = d.message.headers, utcnow()
        expires = parse_time(headers.get("expires"))
        if expires is not None and expires <= now:
            self._revoke_expired(d, name, task_id, expires)
            return True
        eta = parse_time(headers.get("eta"))
        if eta is None or (delay := (eta - now).total_seconds()) <= 0.001:
            return False
        try:
            self.transport.publish(d.queue, d.message, delay=delay)
        except BrokerError as exc:
            logger.warning("Task %s[%s] could not be parked until its eta (%s); "
                           "giving it back", name, task_id, exc)
            self.spawn(self.transport.requeue([d], redelivered=False))
            return True
        self.pump.ack(d)
        return True

    def _revoke_expired(self, d: Delivery, name: str, task_id: str, expires: object) -> None:
        logger.info("Task %s[%s] expired at %s; revoked", name, task_id, expires)
        self._settle_revoked(d, name, task_id, "expired")

    def _settle_revoked(self, d: Delivery, name: str, task_id: str, reason: str) -> None:
        """Acknowledge a message that must not run (revoked, or expired), its result
        ``REVOKED`` and a ``task-revoked`` event stored and sent first."""
        expired = reason == "expired"
        if not expired:
            logger.info("Task %s[%s] revoked; discarded without running", name, task_id)
        self._result(task_id, states.REVOKED, {"exc_type": "TaskRevoked",
                     "exc_module": "celeriac.errors", "exc_message": [reason]}, d)
        if self.flow is not None:
            self.flow.dropped(d.message.headers)
        if d.message.headers.get("group"):  # a chord's header task: its part counts, as
            # Celery counts a revoked one, before its message is acknowledged (revoking.py)
            self.spawn(revoked_on_arrival(self.app, self.transport, d, reason, self.pump.ack))
        else:
            self.pump.ack(d)
        if self.events is not None:
            event = self.events.expired(task_id)
            if not expired:
                event["reason"], event["expired"] = reason, False
            self.pump.final(event)
        if self.app.hooks:
            self.app.hooks.call("task_revoked", received_request(d, self.worker.hostname), expired)
        self.pump.wake.set()

    def revoke_waiting(self, ids: set[str] | None = None) -> int:
        """Settle the jobs of ``ids`` (None: those whose stamps are revoked now) that wait
        in ``reserved``; jobs held by a rate limit are caught as they leave it
        (``_dispatch``). Returns how many."""
        found = [job for job in self.reserved
                 if (job.headers["id"] in ids if ids is not None
                     else "stamped_headers" in job.headers and revoking_stamps(job.headers))]
        for job in found:
            self.reserved.remove(job)
            self._drop_revoked(job)
        return len(found)

    def _skip(self, job: Job) -> None:
        """Acknowledge a job that must not run again (limits.py: it succeeded)."""
        self.pump.ack(self.deliveries.pop(job.seq))

    def _drop_revoked(self, job: Job) -> None:
        if self.flow is not None:
            self.flow.forget((job,))
        self._settle_revoked(self.deliveries.pop(job.seq), job.headers["task"],
                             job.headers["id"], "revoked")

    def _dispatch(self) -> None:
        pool = self.pool
        limiter = self.limiter
        if limiter.due:
            # Held jobs whose token accrued go first, each with its token, in order;
            # those that expired while held are revoked as on arrival.
            for job in limiter.release(self.reserved, pool.free_slots() + pool.queue_slots()):
                self._revoke_expired(self.deliveries.pop(job.seq), job.headers["task"],
                                     job.headers["id"], parse_time(job.headers["expires"]))
        limits = limiter.limits
        while self.reserved and (pool.free_slots() or pool.queue_slots()):
            job = self.reserved.popleft()
            if self._revoked and job.headers["id"] in self._revoked:
                self._drop_revoked(job)  # revoked while it waited (for a rate limit)
                continue
            if revoked_stamps and "stamped_headers" in job.headers and revoking_stamps(
                    job.headers):
                self._drop_revoked(job)  # its stamps were revoked while it waited
                continue
            if self.flow is not None and not self.flow.admit(job):
                continue  # held until a concurrency slot is free (limits.py)
            name = job.headers["task"]
            # The only cost of rate limits to an unlimited task: this lookup (None).
            limit = limits[name]
            if limit is not None and not limiter.admit(limit, job):
                continue  # held until its token accrues; the jobs behind it go on
            task = self.app.tasks[name]
            if not task.acks_late:
                # At-most-once: the message is gone before the task runs.
                self.pump.ack(self.deliveries[job.seq])
            try:
                self.pool.submit(job)
            except Exception as exc:
                # The pool's state is unknown now. The job stays in hand: the cold stop
                # that follows gives it back.
                self.reserved.appendleft(job)
                self._fatal(f"handing Task {job.headers['task']}[{job.headers['id']}] "
                            "to the pool", exc)
                return

    def on_slot(self) -> None:
        self._dispatch()
        self.pump.wake.set()  # a child came up (the pool grew): the pump may fetch for it

    def _rate_due(self) -> None:
        # The Timer's call: a held job's token accrued. Not once stopping: a warm stop
        # gives held jobs back, a cold one has killed the pool.
        if self.pump.fetching:
            self._dispatch()

    def on_job_started(self, job: Job) -> None:
        if self.events is not None:
            self.events.started(job.headers["id"])
        if self.flow is not None:
            self.flow.started(job)
        if self._terminate and (signal := self._terminate.pop(job.headers["id"], None)):
            self._kill_started(job, signal)

    def _kill_started(self, job: Job, signal: str) -> None:
        terminate_job = getattr(self.pool, "terminate_job", None)
        if terminate_job is not None:
            terminate_job(job.headers["id"], signal_number(signal))

    def on_fatal(self, reason: str) -> None:
        """The pool cannot go on (a restart storm): the worker stops."""
        self.worker.fail(reason)

    def on_job_progress(self, task_id: str, state: str, meta: Any) -> None:
        """A running task's ``update_state`` (pools report them only with task events
        on): sent at once, so it precedes the final event, which waits for the store."""
        if self.events is not None:
            self.events.progress(task_id, state, meta)

    def on_job_returned(self, job: Job) -> None:
        """A job the pool took and never started: first in line again."""
        self.limiter.returned(job)  # it keeps the rate-limit token it took
        if self._revoked and job.headers["id"] in self._revoked:
            return self._drop_revoked(job)
        self.reserved.appendleft(job)
        if self.pump.fetching:  # a warm stop gives it back with the other reserved ones
            self._dispatch()

    # -- completion ---------------------------------------------------------------------
    def on_job_done(self, job: Job, outcome: Outcome) -> None:
        self.worker.processed += 1
        self.totals[job.headers["task"]] += 1
        delivery = self.deliveries.pop(job.seq, None)
        pump = self.pump
        if outcome.stored is not None:
            pump.store(outcome.stored)
        if self.flow is not None:
            self.flow.finished(job, outcome)
        if self.events is not None:
            self._final_event(self.events, job, outcome)
        if outcome.settled:  # the child stored the result and acked (``Job.settle``)
            if delivery is not None:
                self.transport.settled_elsewhere([delivery])
        elif delivery is not None:
            self._settle_later(job, delivery, outcome)
        self._dispatch()
        if not outcome.settled or pump.sleeper is None:  # else nothing for the pump
            pump.wake.set()

    def _settle_later(self, job: Job, delivery: Delivery, outcome: Outcome) -> None:
        """Queue the message's settling as ``outcome`` says, for the pump's next turn."""
        action = outcome.action
        if action == "ack":
            task = self.app.tasks.get(job.headers["task"])
            if task is None or task.acks_late:
                self.pump.ack(delivery)
        elif action == "dead_letter":
            self.pump.dead_letter(delivery, outcome.reason or "rejected")
        else:
            # A requeue with a reason is a loss (its process died): it waits a while,
            # longer with each loss, so a task that kills its process every time
            # cannot spin the pool. A task's own Reject(requeue=True) goes back now.
            delay = self._redelivery_delay(delivery.delivery_count) if outcome.reason \
                else 0.0
            self.spawn(self.transport.requeue([delivery], redelivered=True, delay=delay))

    def _final_event(self, events: TaskEvents, job: Job, outcome: Outcome) -> None:
        final = events.outcome(job.headers["id"], outcome)  # sent once the result is stored
        if final is None and outcome.state == states.REVOKED:
            final = {**events.expired(job.headers["id"]), "expired": False,
                     "reason": outcome.reason, "terminated": True}
        if final is not None and outcome.settled:
            events.put(final)  # its result is stored already
        elif final is not None:
            self.pump.final(final)

    def _redelivery_delay(self, losses: int) -> float:
        base: float = self.app.settings.task_redelivery_delay
        return min(base * 2.0 ** min(max(losses - 1, 0), 16), REDELIVERY_DELAY_CAP)

    def _result(self, task_id: str, state: str, result: Any, d: Delivery) -> None:
        try:
            # The message's properties: rpc:// replies to the reply_to they name.
            self.pump.store(self.app.backend.encode(task_id, state, result,
                                                     properties=d.message.properties))
        except Exception:
            logger.exception("Task [%s] could not store state %s", task_id, state)

    def _refuse(self, d: Delivery, refusal: Refusal) -> None:
        """Dead-letter a message that may not run, after storing its failure (if it has
        a usable id) so that a caller in ``get()`` learns why at once."""
        task_id = result_id(d.message.headers)
        logger.error("dead-lettered message %s from queue %r: %s", task_id or "(no id)",
                     d.queue, refusal.reason)
        if task_id is not None:
            self._result(task_id, states.FAILURE, refusal.error, d)
            if self.events is not None:
                self.events.rejected(task_id, refusal.reason, requeue=False)
        self.pump.dead_letter(d, refusal.reason)

    def spawn(self, op: Coroutine[Any, Any, Any]) -> None:
        task = self.loop.create_task(op)
        self._pending.add(task)
        task.add_done_callback(self._op_done)

    def _op_done(self, task: asyncio.Task[Any]) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("broker operation failed", exc_info=task.exception())

