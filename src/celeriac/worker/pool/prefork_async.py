"""The prefork parent's part for ``async def`` jobs (mixed into ``PreforkPool``).

A child is idle (nothing), runs one sync job (``job``), or runs async jobs on its loop
(``tasks``, up to ``child_concurrency``); in either busy state it may hold one job queued
behind (``queued``, the lookahead). So:

- an async job goes to an idle child, else to a child in ``room`` (async jobs in flight,
  room for more, nothing queued), else it is queued behind a busy child (``ahead``);
- a sync job goes to an idle child, else it is queued behind a busy child: one running
  async jobs then takes no more of them, and runs it once they have all ended. When a
  child falls idle while another holds a job it has not started, the recall takes the
  job back for it (``PreforkPool._rebalance``), whatever the kinds: a sync task never
  waits behind a child's async tasks while another child is idle.

Time limits: the child cancels an async job at its hard limit (raising
``TimeLimitExceeded`` at its await); the parent's timer fires ``kill_grace`` later and, if
the job is still running (blocking code never reached an await), kills the child. The job
fails with ``TimeLimitExceeded``; the child's other jobs were not at fault: they go back to
the consumer, first in line, uncounted. A child that dies otherwise loses none of its
jobs either: each is redelivered as a lost sync job is (``_lost``).

Revoke with terminate (``cancel_async``). Killing the child, as for a sync job, would take
down every other async job on its loop, so the parent sends CANCEL (the job's seq) on the
child's control pipe instead; the child cancels that job's asyncio task at its await and
reports its DONE as ``REVOKED``, which settles it here as a terminated sync job is
(``TaskRevoked`` stored, the message acknowledged, never redelivered). The signal the
revoke names is not used: no process is signalled. A job that ignores the cancellation
(it swallows ``CancelledError``, or blocks the loop) is still running
``worker_async_kill_grace`` after the CANCEL; then the child is killed as past a hard
limit: the job ends ``REVOKED`` and its siblings go back to the consumer uncounted.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ... import states
from ...errors import TimeLimitExceeded
from ..execute import Job, Outcome
from . import pipes
from .base import Pool

if TYPE_CHECKING:
    import asyncio

    from ...backends.base import Stored
    from ..execute import Shown
    from ..timer import Timer
    from .children import ChildProc

logger = logging.getLogger("celeriac.worker.pool.prefork")

ASYNC_WINDOW = 2.0
"""Seconds after an async job during which the pool reports room for async jobs."""


class AsyncDispatch(Pool):
    if TYPE_CHECKING:  # PreforkPool's
        loop: asyncio.AbstractEventLoop
        clock: Timer
        children: dict[int, ChildProc]
        idle: dict[ChildProc, None]
        ahead: dict[ChildProc, None]
        room: dict[ChildProc, None]
        child_concurrency: int
        kill_grace: float
        no_lookahead: bool
        _held: int

        def _start(self, proc: ChildProc, job: Job, hard: float | None) -> None: ...
        def _place(self, proc: ChildProc) -> None: ...
        def _release(self) -> None: ...
        def _hand_back(self, job: Job) -> None: ...
        def _kill(self, proc: ChildProc, why: str) -> None: ...
        def _lost(self, job: Job, how: str) -> Outcome: ...
        def _terminated(self, job: Job, reason: str) -> Outcome: ...
        def _failure(self, job: Job, exc: BaseException) -> Stored | None: ...
        def _shown(self, exc: BaseException) -> Shown | None: ...

    def _is_async(self, job: Job) -> bool:
        task = self.app.tasks.get(job.headers["task"])
        return task is not None and task.is_async

    def async_room(self) -> int:
        cc = self.child_concurrency
        return sum(cc - len(c.tasks) for c in self.room)

    def capacity(self) -> int:
        # A child in async mode runs up to child_concurrency jobs: the prefetch follows.
        # For a while after the last async job too: short ones leave the children idle
        # between two fetches, and a prefetch sized then (one job per child) would keep
        # a drain of them at a few in flight.
        if self.loop.time() < self.async_until:
            return self.concurrency * self.child_concurrency
        busy = sum(1 for c in self.children.values() if c.tasks)
        return self.concurrency + busy * (self.child_concurrency - 1)

    async_until = 0.0
    """Loop time until which the prefetch counts every child's async room (``capacity``)."""

    def submit_async(self, job: Job, hard: float | None, soft: float | None) -> None:
        self.async_until = self.loop.time() + ASYNC_WINDOW
        frame = pipes.encode_job(job, soft, hard)
        self._held += 1
        if self.idle:
            proc = next(iter(self.idle))
            del self.idle[proc]
            self.start_async(proc, job, hard)
        elif self.room:
            proc = next(iter(self.room))  # stays there while it has room (_place)
            self.start_async(proc, job, hard)
        else:
            proc = next(iter(self.ahead))
            del self.ahead[proc]
            proc.queued, proc.queued_hard, proc.queued_async = job, hard, True
        self._place(proc)
        proc.writer.write(frame)

    def start_async(self, proc: ChildProc, job: Job, hard: float | None) -> None:
        """``job`` runs on ``proc``'s loop from now."""
        proc.tasks[job.seq] = job
        proc.began[job.seq] = self.loop.time()
        if hard:
            proc.limits[job.seq] = self.clock.call_after(
                hard + self.kill_grace, self._async_hard_limit, proc, job, hard)
        self.client.on_job_started(job)

    def start_any(self, proc: ChildProc, job: Job, hard: float | None, is_async: bool) -> None:
        if is_async:
            self.start_async(proc, job, hard)
        else:
            self._start(proc, job, hard)

    def starts_queued(self, proc: ChildProc) -> bool:
        """Whether ``proc`` starts its queued job now that one of its jobs ended: a sync
        one when nothing runs, an async one when its loop has room."""
        if proc.job is not None:
            return False
        return not proc.tasks or (proc.queued_async and
                                  len(proc.tasks) < self.child_concurrency)

    def place_async(self, proc: ChildProc) -> None:
        """``_place`` for a child in async mode."""
        if proc.queued is None:
            if not self.no_lookahead:
                self.ahead[proc] = None
            if len(proc.tasks) < self.child_concurrency:
                self.room[proc] = None
                return
        else:
            self.ahead.pop(proc, None)  # a job queued behind: it drains for it
        self.room.pop(proc, None)

    def unplace(self, proc: ChildProc) -> None:
        self.idle.pop(proc, None)
        self.ahead.pop(proc, None)
        self.room.pop(proc, None)

    def finish_async(self, proc: ChildProc, seq: int, release: bool = True) -> Job:
        """``proc`` no longer runs async job ``seq`` (done, timed out or lost)."""
        job = proc.tasks.pop(seq)
        proc.began.pop(seq, None)
        for timers in (proc.limits, proc.revoking):
            entry = timers.pop(seq, None)
            if entry is not None:
                entry.cancel()
        if not proc.tasks:
            self.room.pop(proc, None)  # back in sync mode (or gone)
        if release:
            self._release()
        return job

    def _async_hard_limit(self, proc: ChildProc, job: Job, limit: float) -> None:
        if proc.tasks.get(job.seq) is not job:
            return
        logger.error("Task %s[%s] still running %ss past its hard time limit (%ss): "
                     "blocking code in an async task; killing child %d (its other %d "
                     "task(s) will run again)", job.headers["task"], job.headers["id"],
                     self.kill_grace, limit, proc.pid, len(proc.tasks) - 1)
        exc = TimeLimitExceeded(f"hard time limit ({limit}s) exceeded")
        self._kill(proc, "hard time limit")
        self.finish_async(proc, job.seq)
        self.client.on_job_done(job, Outcome("ack", states.FAILURE, "hard time limit", 0.0,
                                             self._failure(job, exc), self._shown(exc)))

    def cancel_async(self, proc: ChildProc, job: Job) -> None:
        """Revoke with terminate of async ``job``, running on ``proc``'s loop: cancel
        that coroutine alone; kill the child if it is still running after the grace."""
        if job.seq in proc.revoking:
            return  # revoked twice: the first CANCEL and its timer stand
        logger.warning("Task %s[%s] revoked: cancelling it on child %d's event loop",
                       job.headers["task"], job.headers["id"], proc.pid)
        proc.revoking[job.seq] = self.clock.call_after(
            self.kill_grace, self._cancel_ignored, proc, job)
        proc.control.write(pipes.frame(pipes.CANCEL, str(job.seq).encode()))

    def _cancel_ignored(self, proc: ChildProc, job: Job) -> None:
        proc.revoking.pop(job.seq, None)
        if proc.tasks.get(job.seq) is not job:
            return
        logger.error("Task %s[%s] still running %ss after it was cancelled (revoked with "
                     "terminate): it ignores the cancellation or blocks its loop; killing "
                     "child %d (its other %d task(s) will run again)", job.headers["task"],
                     job.headers["id"], self.kill_grace, proc.pid, len(proc.tasks) - 1)
        self._kill(proc, "revoked")
        self.finish_async(proc, job.seq)
        self.client.on_job_done(job, self._terminated(
            job, f"terminated: child {proc.pid} killed, the task ignored its cancellation "
                 f"for {self.kill_grace:g}s"))

    def async_exit(self, proc: ChildProc, how: str) -> None:
        """``proc`` exited (reaped, its pipe drained) with async jobs in flight."""
        if not proc.tasks:
            return
        why = proc.killed_for
        for seq in list(proc.tasks):
            if why == "cold shutdown":
                # Their messages stay with the consumer; its disconnect gives them back.
                self.finish_async(proc, seq)
            elif seq in proc.revoking:
                # Revoked with terminate, its cancellation under way: it died with its
                # child, revoked all the same (never redelivered).
                job = self.finish_async(proc, seq)
                self.client.on_job_done(
                    job, self._terminated(job, f"terminated: child {proc.pid} {how}"))
            elif why in ("hard time limit", "revoked"):
                # Killed for another task's limit or revoke: not theirs to count. They run
                # again, first in line (handed back as never started: no delivery spent).
                self._hand_back(self.finish_async(proc, seq, release=False))
            else:
                job = self.finish_async(proc, seq)
                self.client.on_job_done(job, self._lost(job, f"child {proc.pid} {how}"))

