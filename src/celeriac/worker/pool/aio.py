"""``async def`` jobs on one event loop: what a prefork child's loop (``child_aio.py``) and
the threads pool's loop thread (``threads.py``) share.

``TaskSet.start`` runs a job as an asyncio task of its own (so its context variables,
``self.request`` among them, are its own) with its time limits: the soft one raises
``SoftTimeLimitExceeded`` at the await the task waits in, the hard one
``TimeLimitExceeded`` and decides the outcome (``_aio.Guard``). A task that blocks the
loop cannot be interrupted so: the prefork parent kills its child after a grace period.
The set also watches the loop's lag (``_aio.LagWatch``) and names the task that blocks it.

``TaskSet.cancel(seq)`` is a revoke with terminate: that job's asyncio task is cancelled
(``CancelledError`` at the await it waits in, so its ``finally`` blocks and ``async
with`` exits run), and whatever it does after, it ends ``REVOKED`` (reported by
``on_outcome`` as ``Outcome("ack", "REVOKED", reason)``; the pool stores ``TaskRevoked``,
``revoked_outcome``). The other jobs on the loop go on. A job cancelled before it starts
(the seq is in ``cancelled`` when it arrives) is cancelled before its first step. One that
ignores the cancellation (it swallows ``CancelledError``, or blocks the loop) is the
pool's to deal with: the prefork parent kills its child after ``worker_async_kill_grace``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ... import states
from ...errors import SoftTimeLimitExceeded, TaskRevoked, TimeLimitExceeded
from ...runtime.aio import Guard, LagWatch
from ..execute import Job, Outcome, aexecute, exception_repr
from ..revoking import revoked_part

if TYPE_CHECKING:
    from ...app import Celeriac
    from ...runtime.progress import ProgressReporter

logger = logging.getLogger("celeriac.worker.pool.aio")

OnOutcome = Callable[[Job, Outcome], None]

SHOWN_IN_LAG = 3
"""Tasks a lag report lists when no single task holds the loop."""


class TaskSet:
    """The async jobs running on ``loop``; ``on_outcome(job, outcome)`` is called on the
    loop as each ends (before the next job waiting for room can start)."""

    def __init__(self, app: Celeriac, loop: asyncio.AbstractEventLoop, on_outcome: OnOutcome,
                 *, task_events: bool = False, reporter: ProgressReporter | None = None,
                 where: str = "event loop", cancelled: set[int] | None = None) -> None:
        self.app = app
        self.loop = loop
        self.on_outcome = on_outcome
        self.task_events = task_events
        self.reporter = reporter
        self.where = where
        self.running: dict[asyncio.Task[Outcome], Job] = {}
        self.cancelled: set[int] = cancelled if cancelled is not None else set()
        """Seqs of jobs to cancel (revoke with terminate). Another thread may add to it
        (a prefork child's control thread, ``Inbox.cancelled``): a job not started yet
        is cancelled as it starts."""
        self._revoked: set[int] = set()
        """Seqs of running jobs this set cancelled: they end REVOKED."""
        self.lag = LagWatch(loop, app.settings.worker_loop_lag_threshold, self.describe,
                            logger, where)

    def __len__(self) -> int:
        return len(self.running)

    def start(self, job: Job, soft: float | None, hard: float | None) -> None:
        guard = Guard() if soft or hard else None
        task = self.loop.create_task(aexecute(self.app, job, self.task_events, guard))
        self.running[task] = job
        handles: list[asyncio.TimerHandle] = []
        if guard is not None:
            if soft:
                handles.append(self.loop.call_later(
                    soft, guard.interrupt, SoftTimeLimitExceeded("soft time limit exceeded")))
            if hard:
                handles.append(self.loop.call_later(
                    hard, self._hard, guard, job, hard))
        if self.reporter is not None:
            self.reporter.begin(job.headers["id"])
        began = time.monotonic()
        task.add_done_callback(lambda t: self._done(t, handles, began))
        if job.seq in self.cancelled:
            self._cancel(task, job)  # revoked before it arrived: it never takes a step

    def cancel(self, seq: int) -> None:
        """Cancel job ``seq`` (on the loop): now if it runs, else as it starts."""
        self.cancelled.add(seq)
        for task, job in self.running.items():
            if job.seq == seq:
                self._cancel(task, job)
                return

    def _cancel(self, task: asyncio.Task[Outcome], job: Job) -> None:
        if job.seq in self._revoked or task.done():
            return
        self._revoked.add(job.seq)
        logger.warning("Task %s[%s] revoked: cancelling it on %s", job.headers["task"],
                       job.headers["id"], self.where)
        task.cancel()

    def _hard(self, guard: Guard, job: Job, limit: float) -> None:
        logger.error("Task %s[%s] hard time limit (%ss) exceeded; cancelling it",
                     job.headers["task"], job.headers["id"], limit)
        guard.interrupt(TimeLimitExceeded(f"hard time limit ({limit}s) exceeded"))

    def _done(self, task: asyncio.Task[Outcome], handles: list[asyncio.TimerHandle],
              began: float) -> None:
        job = self.running.pop(task)
        for handle in handles:
            handle.cancel()
        if self.reporter is not None:
            # Before DONE: the last progress precedes the task's final event.
            self.reporter.end(job.headers["id"])
        self.cancelled.discard(job.seq)
        if job.seq in self._revoked:
            # Whatever it did once cancelled (returned, raised, swallowed the
            # cancellation and finished), it was revoked: the outcome says so, as a
            # hard time limit's does.
            self._revoked.discard(job.seq)
            if not task.cancelled():
                logger.warning("Task %s[%s] went on after its cancellation and ended; "
                               "it is revoked all the same", job.headers["task"],
                               job.headers["id"])
            self.on_outcome(job, Outcome("ack", states.REVOKED,
                                         f"terminated: cancelled on {self.where}",
                                         time.monotonic() - began))
            return
        try:
            outcome = task.result()
        except BaseException as exc:  # cancelled by a stop, or a bug here
            logger.error("Task %s[%s] did not finish on the loop: %r", job.headers["task"],
                         job.headers["id"], exc)
            outcome = Outcome("requeue", None, repr(exc))
        self.on_outcome(job, outcome)

    def describe(self, task: asyncio.Task[Any] | None) -> str | None:
        if not self.running:
            return None  # no task to blame: the loop was starved, not blocked
        job = self.running.get(task) if task is not None else None
        if job is not None:
            return f"Task {job.headers['task']}[{job.headers['id']}]"
        jobs = list(self.running.values())
        shown = ", ".join(f"{j.headers['task']}[{j.headers['id']}]"
                          for j in jobs[:SHOWN_IN_LAG])
        more = f" and {len(jobs) - SHOWN_IN_LAG} more" if len(jobs) > SHOWN_IN_LAG else ""
        return f"code outside the tasks ({len(jobs)} running: {shown}{more})"

    def cancel_all(self) -> None:
        for task in list(self.running):
            task.cancel()


def revoked_outcome(app: Celeriac, job: Job, reason: str, task_events: bool) -> Outcome:
    """The outcome of a job revoked with terminate (its child killed, or its coroutine
    cancelled): acknowledged, never redelivered, ``TaskRevoked`` stored."""
    logger.warning("Task %s[%s] revoked (%s)", job.headers["task"], job.headers["id"],
                   reason)
    stored = None
    if not job.headers.get("ignore_result"):
        stored = app.backend.encode(job.headers["id"], states.REVOKED, {
            "exc_type": "TaskRevoked", "exc_module": "celeriac.errors",
            "exc_message": [reason]})
    shown = (exception_repr(TaskRevoked(reason)), None) if task_events else None
    if stored is not None and revoked_part(app, job, stored):
        stored = None  # stored with its chord part's count, as Celery's worker does
    return Outcome("ack", states.REVOKED, reason, stored=stored, shown=shown)
