"""A prefork child's event loop: ``async def`` jobs, up to ``worker_child_concurrency`` at
once in one process.

A child is in one of two modes. In sync mode (``child._serve``) its main thread blocks in
a read of the job pipe and runs one job at a time, as it always has. The first async job
switches it to async mode: ``AsyncMode.serve`` runs the child's loop (uvloop when
installed), which reads the job pipe with ``add_reader`` and starts every async job as it
arrives, so several are in flight, each reported by its own DONE (named by its ``seq``).
When the last one ends and no async job waits, the loop stops and the child is back in
sync mode, blocked in its read.

The parent sends a child at most ``limit`` async jobs at once, plus one job queued behind
them (the lookahead, as for sync jobs): an async job when the child is full, or a sync job,
which waits until every async job has ended (a sync task never shares its process's time
with others). A frame that cannot start now goes back to the front of ``Inbox.pending``
and the loop stops reading the pipe until it can; so the child's control thread finds
it there, under the inbox's lock, if the parent recalls it, and the recall rules of sync
jobs hold unchanged: the job is either started here or handed back there, and either
answer follows the DONE that made room for it. STOP waits the same way: a stopping or
recycled child finishes its async jobs first.

A revoke with terminate of an async job cancels that job alone, not the child: the parent
sends CANCEL on the control pipe, the control thread (``channels.py``) hands the seq to
the loop, and the job's asyncio task is cancelled at its await (``aio.TaskSet.cancel``);
its DONE says ``REVOKED`` and the other jobs here go on. A job that ignores the
cancellation (it swallows ``CancelledError`` or blocks the loop) is still running
``worker_async_kill_grace`` later: then the parent kills this child as it does past a
hard time limit (the revoked job ends ``REVOKED``, the others run again elsewhere,
uncounted). Killing at once would take the innocent jobs down with it; waiting for ever
would leave a revoked task running.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...runtime.aio import new_loop
from ..execute import Job, Outcome, is_async
from . import pipes
from .aio import TaskSet

if TYPE_CHECKING:
    from ...app import Celeriac
    from ...runtime.progress import ProgressReporter
    from .channels import Inbox, Outbox

logger = logging.getLogger("celeriac.worker.pool.child")


class AsyncMode:
    def __init__(self, app: Celeriac, inbox: Inbox, outbox: Outbox,
                 after_task: Callable[[], bool], task_events: bool,
                 reporter: ProgressReporter | None) -> None:
        self.app = app
        self.inbox = inbox
        self.outbox = outbox
        self.after_task = after_task
        """Counts a finished task; True when the child must recycle itself."""
        self.limit = app.settings.worker_child_concurrency
        self.loop = new_loop()
        self.tasks = TaskSet(app, self.loop, self._ended, task_events=task_events,
                             reporter=reporter, where=f"child {os.getpid()}'s event loop",
                             cancelled=inbox.cancelled)
        self.retiring = False
        self.exit: int | None = None
        self._finished: asyncio.Future[None] | None = None
        self._reading = False
        self._dones: list[bytes] = []
        """DONE frames not yet written: those of one turn of the loop go in one write
        (timers due together end many tasks at once; a write costs a wake-up of the
        parent)."""

    def serve(self, job: Job, soft: float | None, hard: float | None) -> int | None:
        """Run ``job`` and every async job that follows until none is in flight; the exit
        code when the child must exit (EOF, recycled), else None (back to sync mode: the
        frame that stopped us, if any, is first in ``Inbox.pending``)."""
        return self.loop.run_until_complete(self._serve(job, soft, hard))

    async def _serve(self, job: Job, soft: float | None, hard: float | None) -> int | None:
        self.exit = None
        self._finished = self.loop.create_future()
        self.tasks.lag.start()
        # The control thread calls this after taking frames from the pipe for a RECALL:
        # the pipe may then be empty with async jobs waiting in ``pending``.
        self.inbox.on_pending = self._wake
        self.inbox.on_cancel = self._cancel
        try:
            self.tasks.start(job, soft, hard)
            self._pump()
            await self._finished
        finally:
            self._flush()
            self.inbox.on_pending = None
            self.inbox.on_cancel = None
            self._read(False)
            self.tasks.lag.pause()
        return self.exit

    def _wake(self) -> None:
        self.loop.call_soon_threadsafe(self._pump)

    def _cancel(self, seq: int) -> None:
        # From the control thread. A job that has not started yet is in
        # ``inbox.cancelled`` already: it is cancelled as it starts.
        self.loop.call_soon_threadsafe(self.tasks.cancel, seq)

    def _ended(self, job: Job, outcome: Outcome) -> None:
        if self.after_task():
            self.retiring = True
        # The result travels with DONE (the parent stores it before the ack). Every DONE
        # of a recycled child says so: the parent stops sending it jobs at the first.
        self._dones.append(pipes.encode_done(job.seq, outcome, self.retiring))
        if len(self._dones) == 1:
            self.loop.call_soon(self._flush)
        self._pump()  # room opened: the job waiting for it, or more from the pipe

    def _flush(self) -> None:
        if self._dones:
            data = b"".join(self._dones)
            self._dones.clear()
            self.outbox.send(data)

    def _pump(self) -> None:
        """Start what can start: frames set aside first, then the pipe; stop reading
        while the first waiting frame cannot start; leave async mode once idle."""
        finished = self._finished
        if finished is None or finished.done():
            return  # a wake-up from the control thread after we left
        inbox = self.inbox
        if inbox.pending:
            # A queued job may start below: the DONEs that made room for it go first, so
            # that the control thread's STARTED (or RECALLED) follows them, as the
            # parent's books expect (channels.py).
            self._flush()
        while True:
            with inbox.lock:
                if inbox.pending:
                    started = self._accept(inbox.pending[0])
                    if started:
                        inbox.pending.popleft()
                elif select.select([inbox.job_fd], [], [], 0)[0]:
                    # All that is there, in one read: into ``pending``, where the next
                    # turns take them in order (and a RECALL finds them).
                    frames = pipes.read_frames(inbox.job_fd)
                    if frames is None:
                        started = self._accept(None)
                    else:
                        inbox.pending.extend(frames)
                        started = True
                else:
                    started = False
            if finished.done() or not started:
                break
        if finished.done():
            return
        if not self.tasks.running:
            self._finish(0 if self.retiring else None)
        else:
            self._read(not inbox.pending)

    def _accept(self, frame: tuple[int, bytes] | None) -> bool:
        """Start ``frame``'s job if it may start now (under the inbox's lock)."""
        if frame is None:  # EOF: the parent is gone
            self._finish(0)
            return True
        kind, payload = frame
        if kind != pipes.JOB or self.retiring or len(self.tasks.running) >= self.limit:
            return False
        job, soft, hard = pipes.decode_job(payload)
        if not is_async(self.app, job.headers):
            return False  # a sync job: it waits until the async ones have ended
        self.tasks.start(job, soft, hard)
        return True

    def _read(self, on: bool) -> None:
        if on != self._reading:
            self._reading = on
            if on:
                self.loop.add_reader(self.inbox.job_fd, self._pump)
            else:
                self.loop.remove_reader(self.inbox.job_fd)
            # uvloop makes the descriptor non-blocking; the child reads whole frames with
            # blocking reads (the rest of a frame the parent wrote in parts is coming), in
            # both modes, and the control thread reads it too.
            os.set_blocking(self.inbox.job_fd, True)

    def _finish(self, code: int | None) -> None:
        self.exit = code
        if self._finished is not None and not self._finished.done():
            self._finished.set_result(None)
