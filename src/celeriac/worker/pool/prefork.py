"""The prefork pool (seed 000's AsynPool): N forked children driven from the event loop.

Parent side, all on the worker's loop with no helper thread: each child has a job pipe
(parent writes, non-blocking, with an outbound buffer) and a result pipe (registered with
``add_reader``). ``children`` maps pid -> ``ChildProc``; ``by_fd`` maps a result pipe's fd
to its child. A job goes only to an idle child that has reported UP, so a long task never
holds up work while another child is free; ``idle`` holds exactly those children, so
neither dispatch nor ``free_slots`` scans the pool. Exits are reaped on SIGCHLD and by the
supervisor tick (``supervisor.py``), which also replaces dead children, kills children that
never report UP, and stops the worker on a restart storm.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ... import states
from ...backends.base import Stored
from ...errors import TimeLimitExceeded, WorkerLostError
from ...protocol import Message
from ..execute import Job, Outcome, Shown, exception_repr
from ..timer import Entry, Timer
from . import child as child_main
from . import pipes
from .base import OnDone, Pool
from .supervisor import Supervisor, describe_status

if TYPE_CHECKING:
    from ...app import Celeriac

logger = logging.getLogger("celeriac.worker.pool.prefork")


@dataclass(eq=False)
class ChildProc:
    pid: int
    writer: pipes.FrameWriter
    result_fd: int
    born: float
    reader: pipes.FrameReader = field(default_factory=pipes.FrameReader)
    up: bool = False
    job: Job | None = None
    hard_limit: Entry | None = None
    retiring: bool = False
    """Takes no new job; it exits after the current one (recycled, shrunk, stopping)."""
    killed_for: str | None = None
    detached: bool = False
    """Its pipes are closed. Their descriptor numbers may already belong to a newer
    child's pipes, so nothing may touch them again (not even to close them)."""


class PreforkPool(Pool):
    def __init__(self, app: Celeriac, concurrency: int, on_done: OnDone) -> None:
        super().__init__(app, concurrency, on_done)
        s = app.settings
        self.max_tasks_per_child = s.worker_max_tasks_per_child
        self.max_memory_per_child = s.worker_max_memory_per_child
        self.children: dict[int, ChildProc] = {}
        self.by_fd: dict[int, ChildProc] = {}
        self.idle: dict[ChildProc, None] = {}
        """Children that can take a job now: UP, no job, not retiring, pipes open."""
        self._busy = 0
        """Children with a job."""
        self.closing = False
        self._all_idle = asyncio.Event()
        """Set when ``_busy`` drops to zero; ``join`` waits on it."""
        self._all_gone = asyncio.Event()

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.timer = Timer(self.loop)
        self.supervisor = Supervisor(self)
        for _ in range(self.concurrency):
            self.spawn()
        self.supervisor.start()

    def spawn(self) -> ChildProc:
        job_r, job_w = os.pipe()
        result_r, result_w = os.pipe()
        # The child closes every parent-side end, its siblings' included: otherwise a
        # sibling would hold our pipes open and EOF would never tell us a child died.
        # A detached child's numbers are skipped: os.pipe() may just have handed them to
        # this child's own ends, which the child would then close (seen as EBADF at UP).
        parent_fds = [job_w, result_r]
        for c in self.children.values():
            if not c.detached:
                parent_fds += [c.writer.fd, c.result_fd]
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child, measured by the fault tests
            code = 1
            try:
                os.close(job_w)
                os.close(result_r)
                code = child_main.main(self.app, job_r, result_w, parent_fds,
                                       self.max_tasks_per_child, self.max_memory_per_child,
                                       self.task_events)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(job_r)
        os.close(result_w)
        os.set_blocking(job_w, False)
        os.set_blocking(result_r, False)
        proc = ChildProc(pid, pipes.FrameWriter(self.loop, job_w), result_r, self.loop.time())
        self.children[pid] = proc
        self.by_fd[result_r] = proc
        self._all_gone.clear()
        self.loop.add_reader(result_r, self._on_readable, proc)
        logger.debug("started child %d", pid)
        return proc

    async def join(self) -> None:
        # Cleared here rather than on every submit: only a waiting join needs it.
        if self._busy:
            self._all_idle.clear()
            await self._all_idle.wait()

    async def stop(self) -> None:
        self.closing = True
        for proc in list(self.children.values()):
            self._retire(proc)
        try:
            async with asyncio.timeout(10.0):
                await self._all_gone.wait()
        except TimeoutError:
            logger.warning("children did not exit within 10s of STOP; killing them")
            await self.terminate()
        self.supervisor.stop()

    async def terminate(self) -> None:
        self.closing = True
        for proc in list(self.children.values()):
            self._kill(proc, "cold shutdown")
        await self.supervisor.reap_all(timeout=2.0)
        self.supervisor.stop()

    # -- dispatch -----------------------------------------------------------------------
    def free_slots(self) -> int:
        return len(self.idle)

    def running(self) -> list[Job]:
        return [c.job for c in self.children.values() if c.job is not None]

    def submit(self, job: Job) -> None:
        # The child idle the longest. Handing jobs round the children measured faster
        # than reusing the one that just reported (SQLite prefork x2 drain: 8.2k/s
        # against 6.3k/s).
        hard, soft = self._limits(job)  # before the child leaves ``idle``: it may raise
        proc = next(iter(self.idle))
        del self.idle[proc]
        proc.job = job
        self._busy += 1
        if hard:
            proc.hard_limit = self.timer.call_after(hard, self._hard_limit, proc, job, hard)
        meta = (job.id, job.headers, job.content_type, job.queue, job.delivery_count,
                job.hostname, soft)
        proc.writer.write(pipes.frame_with_blob(pipes.JOB, meta, job.body))

    def _limits(self, job: Job) -> tuple[float | None, float | None]:
        limits = job.headers.get("timelimit") or (None, None)
        task = self.app.tasks.get(job.headers["task"])
        s = self.app.settings
        hard = limits[0] or (task and task.options.time_limit) or s.task_time_limit
        soft = limits[1] or (task and task.options.soft_time_limit) or s.task_soft_time_limit
        return hard, soft

    def _set_idle(self, proc: ChildProc) -> None:
        if (proc.up and proc.job is None and not proc.retiring and not proc.detached
                and not proc.writer.closed):
            self.idle[proc] = None

    # -- child -> parent ----------------------------------------------------------------
    def _on_readable(self, proc: ChildProc) -> None:
        try:
            self._read(proc)
        except Exception as exc:
            # A bug here leaves the pool's books wrong: a worker that keeps running could
            # sit idle with work waiting. Exit non-zero instead; what it held is given
            # back by the cold stop, or redelivered when its lease ends.
            logger.critical("the pool failed reading child %d", proc.pid, exc_info=exc)
            self.loop.remove_reader(proc.result_fd)
            self.on_fatal(f"the pool failed reading child {proc.pid}: "
                          f"{type(exc).__name__}: {exc}")

    def _read(self, proc: ChildProc) -> None:
        try:
            data = os.read(proc.result_fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._detach(proc)  # EOF: the child exited; the supervisor reaps it
            self.supervisor.reap_soon()
            return
        self._frames(proc, data)

    def _drain(self, proc: ChildProc) -> None:
        """Read what a dead child wrote before it died (a DONE frame, say) before its
        pipe is closed: otherwise a finished task would count as lost and run again."""
        while not proc.detached:
            try:
                data = os.read(proc.result_fd, 1 << 16)
            except OSError:  # BlockingIOError included: nothing more was written
                return
            if not data:
                return
            self._frames(proc, data)

    def _frames(self, proc: ChildProc, data: bytes) -> None:
        for kind, payload in proc.reader.feed(data):
            if kind == pipes.DONE:
                self._on_done_frame(proc, payload)
            elif kind == pipes.RELAY_RESULT:
                (task_id, content_type, expires_at), blob = pipes.split_blob(payload)
                self.app.backend.store_many([Stored(task_id, content_type, blob, expires_at)])
            elif kind == pipes.UP:
                proc.up = True
                self._set_idle(proc)
                self.on_ready()
            elif kind == pipes.RELAY_PUBLISH:
                meta, blob = pipes.split_blob(payload)
                message = Message.from_envelope(meta["envelope"].encode(), blob)
                self.app.transport.publish(meta["queue"], message, delay=meta["delay"])

    def _on_done_frame(self, proc: ChildProc, payload: bytes) -> None:
        meta, data = pipes.split_blob(payload)
        job_id, action, state, reason, runtime, retire = meta[:6]
        job = proc.job
        if job is None or job.id != job_id:
            return  # already settled (hard time limit fired as it finished)
        stored = shown = None
        if len(meta) > 6:
            if meta[6] is not None:
                stored = Stored(job.headers["id"], meta[6], data, meta[7])
            if meta[8] is not None:
                shown = (meta[8][0], meta[8][1])
        if retire:
            proc.retiring = True  # the child exits by itself
            logger.info("child %d recycled (max tasks or memory per child)", proc.pid)
        elif proc.retiring:
            proc.writer.write(pipes.frame(pipes.STOP))
        self._finish(proc)
        # The slot that opened is reported by on_done (the consumer dispatches from
        # there); on_ready is only for slots that open otherwise.
        self.on_done(job, Outcome(action, state, reason, runtime, stored, shown))

    def _finish(self, proc: ChildProc) -> None:
        """``proc`` no longer runs its job (done, timed out or lost)."""
        proc.job = None
        self._busy -= 1
        if proc.hard_limit is not None:
            proc.hard_limit.cancel()
            proc.hard_limit = None
        self._set_idle(proc)
        if not self._busy:
            self._all_idle.set()

    # -- limits and losses --------------------------------------------------------------
    def _hard_limit(self, proc: ChildProc, job: Job, limit: float) -> None:
        if proc.job is not job:
            return
        name, task_id = job.headers["task"], job.headers["id"]
        logger.error("Task %s[%s] hard time limit (%ss) exceeded; killing child %d",
                     name, task_id, limit, proc.pid)
        exc = TimeLimitExceeded(f"hard time limit ({limit}s) exceeded")
        self._kill(proc, "hard time limit")
        self._finish(proc)
        self.on_done(job, Outcome("ack", states.FAILURE, "hard time limit",
                                  stored=self._failure(job, exc), shown=self._shown(exc)))

    def on_child_exit(self, proc: ChildProc, status: int) -> None:
        """Called by the supervisor once ``proc`` has been reaped."""
        self._drain(proc)
        self._detach(proc)
        self.children.pop(proc.pid, None)
        how = describe_status(status)
        job = proc.job
        if job is not None:
            self._finish(proc)
            # Killed by a cold stop: not the task's fault, so not a counted loss. Its
            # message stays with the consumer, whose disconnect gives it back uncounted.
            if proc.killed_for != "cold shutdown":
                self.on_done(job, self._lost(job, f"child {proc.pid} {how}"))
        if not self.children:
            self._all_gone.set()
        planned = proc.retiring or proc.killed_for in ("hard time limit", "cold shutdown")
        if not planned:
            logger.error("child %d %s", proc.pid, how)
        if not self.closing:
            if not planned and not self.supervisor.allow_restart(proc, how):
                return
            if len(self.children) < self.concurrency:
                self.spawn()

    def _lost(self, job: Job, how: str) -> Outcome:
        name, task_id = job.headers["task"], job.headers["id"]
        task = self.app.tasks.get(name)
        acks_late = task.acks_late if task is not None else True
        limit = self.app.settings.task_max_deliveries
        if acks_late and job.delivery_count < limit:
            logger.error("Task %s[%s] lost: %s; redelivering (delivery %d of %d)",
                         name, task_id, how, job.delivery_count, limit)
            return Outcome("requeue", reason=how)
        reason = (f"{how} (delivery {job.delivery_count} of {limit})" if acks_late
                  else f"{how}; acks_late=False, not redelivered")
        logger.error("Task %s[%s] failed: WorkerLostError: %s", name, task_id, reason)
        exc = WorkerLostError(reason)
        return Outcome("dead_letter" if acks_late else "ack", states.FAILURE, reason,
                       stored=self._failure(job, exc), shown=self._shown(exc))

    def _shown(self, exc: BaseException) -> Shown | None:
        return (exception_repr(exc), None) if self.task_events else None

    def _failure(self, job: Job, exc: BaseException) -> Stored | None:
        """The failure to store for ``job`` (the consumer stores it before settling)."""
        if job.headers.get("ignore_result"):
            return None
        return self.app.backend.encode(job.headers["id"], states.FAILURE, exc,
                                       retries=int(job.headers.get("retries") or 0))

    # -- sizing -------------------------------------------------------------------------
    def grow(self, n: int = 1) -> None:
        for _ in range(n):
            self.concurrency += 1
            self.spawn()
        logger.info("pool grew by %d to %d", n, self.concurrency)

    def shrink(self, n: int = 1) -> None:
        n = min(n, self.concurrency - 1)
        if n <= 0:
            return
        # Idle children first; busy ones finish their task before they go.
        candidates = sorted((c for c in self.children.values() if not c.retiring),
                            key=lambda c: c.job is not None)
        for proc in candidates[:n]:
            self._retire(proc)
        self.concurrency -= n
        logger.info("pool shrank by %d to %d", n, self.concurrency)

    def _retire(self, proc: ChildProc) -> None:
        proc.retiring = True
        self.idle.pop(proc, None)
        if proc.job is None:
            proc.writer.write(pipes.frame(pipes.STOP))

    def _kill(self, proc: ChildProc, why: str) -> None:
        proc.killed_for = why
        proc.retiring = True  # a dying child gets no new job
        self.idle.pop(proc, None)
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)

    def _detach(self, proc: ChildProc) -> None:
        self.idle.pop(proc, None)  # its pipes are closed: a job sent to it would be lost
        if proc.detached:
            return
        # Once only, and keyed by the child rather than by descriptor number: a second
        # close, or a lookup by a recycled number, would close a newer child's pipe.
        proc.detached = True
        if self.by_fd.get(proc.result_fd) is proc:
            del self.by_fd[proc.result_fd]
        self.loop.remove_reader(proc.result_fd)
        os.close(proc.result_fd)
        proc.writer.close()
