"""``async def`` jobs on one event loop: what a prefork child's loop (``child_aio.py``) and
the threads pool's loop thread (``threads.py``) share.

``TaskSet.start`` runs a job as an asyncio task of its own (so its context variables,
``self.request`` among them, are its own) with its time limits: the soft one raises
``SoftTimeLimitExceeded`` at the await the task waits in, the hard one
``TimeLimitExceeded`` and decides the outcome (``_aio.Guard``). A task that blocks the
loop cannot be interrupted so: the prefork parent kills its child after a grace period.
The set also watches the loop's lag (``_aio.LagWatch``) and names the task that blocks it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..._aio import Guard, LagWatch
from ...errors import SoftTimeLimitExceeded, TimeLimitExceeded
from ..execute import Job, Result, aexecute_message

if TYPE_CHECKING:
    from ..._progress import ProgressReporter
    from ...app import Celeriac

logger = logging.getLogger("celeriac.worker.pool.aio")

OnResult = Callable[[Job, Result], None]

SHOWN_IN_LAG = 3
"""Tasks a lag report lists when no single task holds the loop."""


class TaskSet:
    """The async jobs running on ``loop``; ``on_result(job, result)`` is called on the
    loop as each ends (before the next job waiting for room can start)."""

    def __init__(self, app: Celeriac, loop: asyncio.AbstractEventLoop, on_result: OnResult,
                 *, task_events: bool = False, reporter: ProgressReporter | None = None,
                 where: str = "event loop") -> None:
        self.app = app
        self.loop = loop
        self.on_result = on_result
        self.task_events = task_events
        self.reporter = reporter
        self.running: dict[asyncio.Task[Result], Job] = {}
        self.lag = LagWatch(loop, app.settings.worker_loop_lag_threshold, self.describe,
                            logger, where)

    def __len__(self) -> int:
        return len(self.running)

    def start(self, job: Job, soft: float | None, hard: float | None) -> None:
        guard = Guard() if soft or hard else None
        coro = aexecute_message(self.app, job.headers, job.body, job.content_type, job.queue,
                                job.delivery_count, job.hostname, self.task_events, guard)
        task = self.loop.create_task(coro)
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
        task.add_done_callback(lambda t: self._done(t, handles))

    def _hard(self, guard: Guard, job: Job, limit: float) -> None:
        logger.error("Task %s[%s] hard time limit (%ss) exceeded; cancelling it",
                     job.headers["task"], job.headers["id"], limit)
        guard.interrupt(TimeLimitExceeded(f"hard time limit ({limit}s) exceeded"))

    def _done(self, task: asyncio.Task[Result], handles: list[asyncio.TimerHandle]) -> None:
        job = self.running.pop(task)
        for handle in handles:
            handle.cancel()
        if self.reporter is not None:
            # Before DONE: the last progress precedes the task's final event.
            self.reporter.end(job.headers["id"])
        try:
            result = task.result()
        except BaseException as exc:  # cancelled by a stop, or a bug here
            logger.error("Task %s[%s] did not finish on the loop: %r", job.headers["task"],
                         job.headers["id"], exc)
            result = ("requeue", None, repr(exc), 0.0, None, None)
        self.on_result(job, result)

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
