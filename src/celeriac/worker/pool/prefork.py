"""The prefork pool (seed 000's AsynPool): N forked children driven from the event loop.

Parent side, all on the worker's loop with no helper thread. ``children`` maps pid ->
``ChildProc`` (``children.py``); ``by_fd`` maps a result pipe's fd to its child. Exits are
reaped on SIGCHLD and by the supervisor tick (``supervisor.py``), which also replaces dead
children, kills children that never report UP, and stops the worker on a restart storm.

Dispatch. A job goes to an idle child first (``idle``). When every child is busy, a child
may hold one more job in its pipe behind the one it runs (``ahead``: the lookahead), so
that it starts its next task the moment it reports the last, instead of waiting for the
parent to read that report and answer (with tasks that wait on the network, children
spent about 40% of their time waiting so). Fairness is kept by recalling: whenever a child
is idle while another holds a job it has not started, the parent asks for that job back
(RECALL on the control pipe; the child's control thread answers RECALLED, see
``channels.py``) and runs it on the idle child, once the task in front of it has run for
``RECALL_AFTER`` (1 ms): a shorter one ends before a recall would come back. A long task
therefore never holds a short one back while another child is free, for longer than that
and the recall.

Async jobs (``async def`` tasks) go to a child's event loop, up to
``worker_child_concurrency`` per child (``room``; ``prefork_async.py``): a child runs
either one sync job or several async ones, and holds at most one job queued behind them.

Revoke with terminate kills the child running a sync job (the job ends ``REVOKED``), and
cancels an async job on its child's loop, leaving the child and its other jobs running
(``prefork_async.py``).

Restart storms. A child that dies while it runs something (a sync job, async jobs in
flight, a job in limbo) is not counted by the supervisor's storm guard: each of those
jobs already counts the death against its message (redelivered, then dead-lettered after
``task_max_deliveries``), so a burst of poison messages is dead-lettered while the worker
stays up. A death with nothing running (a broken ``worker_process_init``, a child that
dies before UP or while idle) counts (``supervisor.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from typing import TYPE_CHECKING

from ... import states
from ...backends.base import Stored
from ...errors import TimeLimitExceeded, WorkerLostError
from ...protocol import Message
from ..execute import Job, Outcome, Shown, exception_repr
from ..timer import TICK, Entry, Timer
from . import child as child_main
from . import pipes
from .aio import revoked_outcome
from .base import Pool, PoolClient
from .children import ChildProc, fork_child
from .prefork_async import AsyncDispatch
from .supervisor import Supervisor, describe_status

if TYPE_CHECKING:
    from ...app import Celeriac

logger = logging.getLogger("celeriac.worker.pool.prefork")

RECALL_AFTER = 0.001
"""Seconds a child's sync job runs before a job queued behind it is recalled for an idle
child. Most tasks are shorter: with paced arrivals, two children and no grace, one task
in 12 was recalled, and half of those had started by the time the recall came (a wake-up
of the child's control thread, a GIL hand-off and a frame each way, for nothing)."""

IGNORED_BY_CHILDREN = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGQUIT})
"""Signals a pool child ignores (``child.py``)."""


class PreforkPool(AsyncDispatch, Pool):
    settles_direct = True
    """A child settles a job's message itself when the job says how (``Job.settle``,
    ``child._settle``): sync jobs only; an async job's outcome comes back unsettled."""

    def __init__(self, app: Celeriac, concurrency: int, *, timer: Timer | None = None,
                 client: PoolClient | None = None) -> None:
        super().__init__(app, concurrency, timer=timer, client=client)
        s = app.settings
        self.max_tasks_per_child = s.worker_max_tasks_per_child
        self.max_memory_per_child = s.worker_max_memory_per_child
        self.children: dict[int, ChildProc] = {}
        self.by_fd: dict[int, ChildProc] = {}
        self.idle: dict[ChildProc, None] = {}
        """Children that can start a job now: UP, nothing held, not retiring, pipes open."""
        self.ahead: dict[ChildProc, None] = {}
        """Busy children with room for one job behind the one(s) they run."""
        self.room: dict[ChildProc, None] = {}
        """Children running async jobs with room for more, nothing queued (async mode)."""
        self.child_concurrency = s.worker_child_concurrency
        self.kill_grace = s.worker_async_kill_grace
        self._held = 0
        """Jobs in children, running or queued."""
        self.closing = False
        self.no_lookahead = False
        """Set by a warm stop: jobs go only to idle children, and none is handed back to
        one."""
        self._recheck: Entry | None = None
        """The timer of a recall put off by ``RECALL_AFTER``."""
        self._all_idle = asyncio.Event()
        """Set when ``_held`` drops to zero; ``join`` waits on it."""
        self._all_gone = asyncio.Event()

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.clock: Timer = self.timer or Timer(self.loop)
        self.supervisor = Supervisor(self)
        for _ in range(self.concurrency):
            self.spawn()
        self.supervisor.start()

    def spawn(self) -> ChildProc:
        def run(job_r: int, control_r: int, result_w: int, parent_fds: list[int]) -> int:
            return child_main.main(self.app, job_r, control_r, result_w, parent_fds,
                                   self.max_tasks_per_child, self.max_memory_per_child,
                                   self.task_events)

        proc = fork_child(self.loop, self.children.values(), run)
        self.children[proc.pid] = proc
        self.by_fd[proc.result_fd] = proc
        self._all_gone.clear()
        self.loop.add_reader(proc.result_fd, self._on_readable, proc)
        logger.debug("started child %d", proc.pid)
        return proc

    async def join(self) -> None:
        # Cleared here rather than on every submit: only a waiting join needs it.
        if self._held:
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

    async def recall_queued(self) -> None:
        self.no_lookahead = True
        self.ahead.clear()
        for proc in self.children.values():
            if proc.queued is not None and not proc.recalling and not proc.detached:
                self._recall(proc)
        # The control thread answers within a GIL switch interval; a job the child took
        # first is running and finishes as running jobs do.
        deadline = self.loop.time() + 2.0
        while any(c.queued is not None for c in self.children.values()):
            if self.loop.time() > deadline:
                logger.warning("jobs queued in children were not handed back within 2s")
                return
            await asyncio.sleep(0.005)

    # -- dispatch -----------------------------------------------------------------------
    def free_slots(self) -> int:
        # The room on children's loops counts only while async jobs run: a sync job
        # submitted then is queued behind them (``submit``).
        return len(self.idle) + (self.async_room() if self.room else 0)

    def queue_slots(self) -> int:
        return len(self.ahead)

    def running(self) -> list[Job]:
        return [j for c in self.children.values()
                for j in (c.job, c.queued, *c.tasks.values()) if j is not None]

    def submit(self, job: Job) -> None:
        hard, soft = self.limits(job)  # before a child is taken: it may raise
        if self._is_async(job):
            self.submit_async(job, hard, soft)
            return
        frame = pipes.encode_job(job, soft)
        self._held += 1
        if self.idle:
            # The child idle the longest. Handing jobs round the children measured faster
            # than reusing the one that just reported (SQLite prefork x2 drain: 8.2k/s
            # against 6.3k/s).
            proc = next(iter(self.idle))
            del self.idle[proc]
            self._start(proc, job, hard)
        else:
            # Behind a sync job, or behind a child's async jobs (it takes no more of
            # them then, and runs this one once they have all ended).
            proc = next(iter(self.ahead))
            del self.ahead[proc]
            proc.queued, proc.queued_hard, proc.queued_async = job, hard, False
        self._place(proc)
        proc.writer.write(frame)

    def _start(self, proc: ChildProc, job: Job, hard: float | None) -> None:
        """``job`` runs on ``proc`` from now: its hard time limit counts from here."""
        proc.job = job
        proc.started = self.loop.time()
        if hard:
            proc.hard_limit = self.clock.call_after(hard, self._hard_limit, proc, job, hard)
        self.client.on_job_started(job)

    def _place(self, proc: ChildProc) -> None:
        """Put ``proc`` in ``idle`` or ``ahead`` (or ``room``) if it belongs there."""
        if not proc.up or proc.retiring or proc.detached or proc.writer.closed:
            return
        if proc.tasks:
            self.place_async(proc)
        elif proc.job is None and proc.queued is None:
            self.idle[proc] = None
        elif proc.queued is None and not self.no_lookahead:
            self.ahead[proc] = None

    def _rebalance(self) -> None:
        """Recall jobs waiting behind running ones while children are idle; not from a
        child whose sync job started less than ``RECALL_AFTER`` ago (looked at again
        then), which will most likely start it sooner than the recall would."""
        if not self.idle:
            return  # the busy case, after every DONE of a drain: nothing to scan
        wanted = len(self.idle) - sum(1 for c in self.children.values() if c.recalling)
        now = self.loop.time()
        later: float | None = None
        for proc in self.children.values():
            if wanted <= 0:
                return
            if proc.queued is not None and not proc.recalling and not proc.detached:
                due = proc.started + RECALL_AFTER if proc.job is not None else now
                if due - now >= TICK:  # else a timer would spin the loop (TICK)
                    later = due if later is None else min(later, due)
                    continue
                self._recall(proc)
                wanted -= 1
        if later is not None and self._recheck is None:
            self._recheck = self.clock.call_at(later, self._rechecked)

    def _rechecked(self) -> None:
        self._recheck = None
        self._rebalance()

    def _recall(self, proc: ChildProc) -> None:
        assert proc.queued is not None
        proc.recalling = True
        proc.control.write(pipes.frame(pipes.RECALL, str(proc.queued.seq).encode()))

    def _hand_back(self, job: Job) -> None:
        """A job that never started (recalled, or its child is gone): run it elsewhere."""
        self._release()
        if self.idle and not self.closing and not self.no_lookahead:
            self.submit(job)
        else:
            self.client.on_job_returned(job)

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
            self.client.on_fatal(f"the pool failed reading child {proc.pid}: "
                          f"{type(exc).__name__}: {exc}")

    def _read(self, proc: ChildProc) -> bool:
        """Read and handle what ``proc`` wrote; False when there was nothing (EOF
        detaches it: the child exited, and the supervisor reaps it)."""
        try:
            data = os.read(proc.result_fd, 1 << 16)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            self._detach(proc)
            self.supervisor.reap_soon()
            return False
        self._frames(proc, data)
        return True

    def _drain(self, proc: ChildProc) -> None:
        """Read what a dead child wrote before it died (a DONE frame, say) before its
        pipe is closed: otherwise a finished task would count as lost and run again."""
        while not proc.detached and self._read(proc):
            pass

    def _frames(self, proc: ChildProc, data: bytes) -> None:
        for kind, payload in proc.reader.feed(data):
            if kind == pipes.DONE:
                self._on_done_frame(proc, *pipes.decode_done(payload))
            elif kind == pipes.RECALLED:
                self._on_recalled(proc, int(payload))
            elif kind == pipes.STARTED:
                self._on_started_late(proc, int(payload))
            elif kind == pipes.RELAY_RESULT:
                (task_id, content_type, expires_at), blob = pipes.split_blob(payload)
                self.app.backend.store_many([Stored(task_id, content_type, blob, expires_at)])
            elif kind == pipes.UP:
                proc.up = True
                self._place(proc)
                self.client.on_slot()
                self._rebalance()
            elif kind == pipes.RELAY_PUBLISH:
                meta, blob = pipes.split_blob(payload)
                message = Message.from_envelope(meta["envelope"].encode(), blob)
                self.app.transport.publish(meta["queue"], message, delay=meta["delay"])
            elif kind == pipes.RELAY_CHORD:
                self._relay_chord(proc, payload)
            elif kind == pipes.PROGRESS:
                self._on_progress(proc, payload)

    def _on_progress(self, proc: ChildProc, payload: bytes) -> None:
        """A running task's ``update_state`` (the child sends them only with task
        events on). A frame read after its job was settled otherwise (a hard time limit
        killed the child as it wrote) is dropped: its task's final event is out."""
        task_id, state, meta = pipes.decode_progress(payload)
        for job in (proc.job, proc.queued, *proc.tasks.values()):  # queued: in limbo
            if job is not None and job.headers["id"] == task_id:
                self.client.on_job_progress(task_id, state, meta)
                return

    def _relay_chord(self, proc: ChildProc, payload: bytes) -> None:
        """A child's ``chord_part`` on the backend in this process's memory; the child
        waits for the answer. Run here on the loop: a process-local backend answers at
        once (it never waits on a network), and this is the only process that holds the
        count, so the backend's own lock makes it atomic across all the children."""
        group_id, task_id, size = pipes.decode_chord_part(payload)
        try:
            answer = pipes.encode_chord_answer(
                self.app.backend.chord_part(group_id, task_id, size))
        except Exception as exc:  # the child raises it; the pool goes on
            logger.error("chord_part for child %d failed: %r", proc.pid, exc)
            answer = pipes.encode_chord_answer(None, f"{type(exc).__name__}: {exc}")
        # On the job pipe, behind any job already sent: the child sets those aside.
        proc.writer.write(answer)

    def _on_done_frame(self, proc: ChildProc, seq: int, retire: bool, outcome: Outcome
                       ) -> None:
        job, queued = proc.job, proc.queued
        if job is not None and job.seq == seq:
            self._finish(proc)
        elif seq in proc.tasks:
            job = self.finish_async(proc, seq)
        elif job is None and queued is not None and queued.seq == seq:
            # In limbo (recalled as it started): it ran, and finished before the child's
            # answer to the RECALL came. Its start is reported late, once; its hard time
            # limit was never armed, for a task that short.
            job, queued = queued, None
            proc.queued, proc.recalling = None, False
            self._release()
            self.client.on_job_started(job)
        else:
            return  # already settled (hard time limit fired as it finished)
        back = None
        if retire:
            if not proc.retiring:
                logger.info("child %d recycled (max tasks or memory per child)%s", proc.pid,
                            f" after its {len(proc.tasks)} async task(s) in flight"
                            if proc.tasks else "")
            # The child exits by itself (once its async jobs have ended), leaving its
            # pipe unread.
            self.unplace(proc)
            proc.retiring = True
            back, proc.queued, proc.recalling = queued, None, False
        elif queued is not None and not proc.recalling and self.starts_queued(proc):
            # It started the job behind this one as it wrote this report.
            proc.queued = None
            self.start_any(proc, queued, proc.queued_hard, proc.queued_async)
        self._place(proc)
        if outcome.state == states.REVOKED:
            # An async job cancelled by a revoke with terminate (only those come back
            # so): settled as a terminated sync job is, TaskRevoked stored here.
            outcome = self._terminated(job, outcome.reason or "terminated")
        # The slot that opened is reported by on_job_done (the consumer dispatches from
        # there); on_slot is only for slots that open otherwise.
        self.client.on_job_done(job, outcome)
        if back is not None:
            self._hand_back(back)
        self._rebalance()

    def _on_recalled(self, proc: ChildProc, seq: int) -> None:
        job = proc.queued
        if job is None or job.seq != seq:
            return  # stale: settled otherwise
        proc.queued, proc.recalling = None, False
        self._place(proc)
        self._hand_back(job)

    def _on_started_late(self, proc: ChildProc, seq: int) -> None:
        job = proc.queued
        if job is None or job.seq != seq or proc.job is not None:
            return  # stale: settled otherwise
        proc.queued, proc.recalling = None, False
        self.start_any(proc, job, proc.queued_hard, proc.queued_async)
        self._place(proc)

    def _finish(self, proc: ChildProc) -> None:
        """``proc`` no longer runs its job (done, timed out or lost)."""
        proc.job = None
        if proc.hard_limit is not None:
            proc.hard_limit.cancel()
            proc.hard_limit = None
        self._release()

    def _release(self) -> None:
        """A job left the pool (done, lost, or handed back)."""
        self._held -= 1
        if not self._held:
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
        self.client.on_job_done(job, Outcome("ack", states.FAILURE, "hard time limit", 0.0,
                                             self._failure(job, exc), self._shown(exc)))

    def on_child_exit(self, proc: ChildProc, status: int) -> None:
        """Called by the supervisor once ``proc`` has been reaped."""
        self._drain(proc)
        self._detach(proc)
        self.children.pop(proc.pid, None)
        how = describe_status(status)
        job, queued = proc.job, proc.queued
        proc.queued = None
        in_flight = len(proc.tasks)
        self.async_exit(proc, how)
        in_flight += self._settle_exit(proc, job, queued, how)
        if not self.children:
            self._all_gone.set()
        self._replace(proc, how, in_flight)

    def _settle_exit(self, proc: ChildProc, job: Job | None, queued: Job | None, how: str
                     ) -> int:
        """Settle the sync job ``proc`` ran and the job queued behind it, now that it
        exited; 1 if it was running a job (the death counts against that job), else 0."""
        if job is None and queued is not None and proc.recalling:
            job, queued = queued, None  # in limbo: it may have started, so it counts
            proc.job = job
        cold = proc.killed_for == "cold shutdown"
        if job is not None:
            self._finish(proc)
            # Killed by a cold stop: not the task's fault, so not a counted loss. Its
            # message stays with the consumer, whose disconnect gives it back uncounted.
            if proc.killed_for == "revoked" and proc.revoked is job:
                self.client.on_job_done(job, self._terminated(job, f"terminated: child {how}"))
            elif not cold:
                self.client.on_job_done(job, self._lost(job, f"child {proc.pid} {how}"))
        if queued is not None:
            if cold:
                self._release()
            else:
                self._hand_back(queued)  # it never started: not a loss
        return 0 if job is None else 1

    def _replace(self, proc: ChildProc, how: str, in_flight: int) -> None:
        """Spawn a child in place of ``proc``, which exited, unless the pool is closing
        or the death makes a restart storm (``in_flight``: the jobs it was running)."""
        planned = proc.retiring or proc.killed_for in ("hard time limit", "cold shutdown",
                                                       "revoked")
        if not planned:
            logger.error("child %d %s", proc.pid, how)
        if not self.closing:
            # A death with jobs in flight was counted against their messages (``_lost``:
            # redelivered, then dead-lettered); the storm guard counts the others.
            if not planned and not self.supervisor.allow_restart(proc, how, in_flight):
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
        return Outcome("dead_letter" if acks_late else "ack", states.FAILURE, reason, 0.0,
                       self._failure(job, exc), self._shown(exc))

    # -- revoke with terminate --------------------------------------------------------
    def terminate_job(self, task_id: str, signum: int) -> bool:
        """Send ``signum`` to the child running ``task_id``; False if no child runs it
        (not started yet). When that child dies, the job ends ``REVOKED`` and its
        message is acknowledged: a revoked task is never redelivered. Children ignore
        SIGTERM, SIGINT and SIGQUIT (a terminal's Ctrl-C must not kill tasks), so for
        those the child gets SIGKILL as well.

        An async job is cancelled on its child's loop instead (``cancel_async``): the
        child runs other async jobs, which go on; ``signum`` is not used."""
        for proc in self.children.values():
            if proc.detached:
                continue
            for running in proc.tasks.values():
                if running.headers["id"] == task_id:
                    self.cancel_async(proc, running)
                    return True
            job = proc.job
            if job is None or job.headers["id"] != task_id:
                continue
            logger.warning("Task %s[%s] revoked: terminating child %d with %s",
                           job.headers["task"], task_id, proc.pid,
                           signal.Signals(signum).name)
            proc.killed_for, proc.revoked = "revoked", job
            proc.retiring = True  # a dying child gets no new job
            self.idle.pop(proc, None)
            self.ahead.pop(proc, None)
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signum)
                if signum in IGNORED_BY_CHILDREN:
                    os.kill(proc.pid, signal.SIGKILL)
            return True
        return False

    def _terminated(self, job: Job, reason: str) -> Outcome:
        return revoked_outcome(self.app, job, reason, self.task_events)

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
        # Idle children first; busy ones finish what they hold before they go.
        candidates = sorted((c for c in self.children.values() if not c.retiring),
                            key=lambda c: c.job is not None or bool(c.tasks))
        for proc in candidates[:n]:
            self._retire(proc)
        self.concurrency -= n
        logger.info("pool shrank by %d to %d", n, self.concurrency)

    def _retire(self, proc: ChildProc) -> None:
        proc.retiring = True
        self.unplace(proc)
        # In order behind whatever it holds: it finishes those, then stops.
        proc.writer.write(pipes.frame(pipes.STOP))

    def _kill(self, proc: ChildProc, why: str) -> None:
        proc.killed_for = why
        proc.retiring = True  # a dying child gets no new job
        self.unplace(proc)
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)

    def _detach(self, proc: ChildProc) -> None:
        # Its pipes are closed: a job sent to it would be lost.
        self.unplace(proc)
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
        proc.control.close()

