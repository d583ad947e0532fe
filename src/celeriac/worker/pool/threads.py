"""The threads pool (``-P threads -c N``): sync tasks in N threads of the worker process,
as Celery's threads pool; ``async def`` tasks on an event loop in one more thread.

For I/O-bound sync code (clients that release the GIL while they wait) without the memory
of N processes. Async tasks get a loop thread of their own rather than the worker's loop:
the worker's loop renews the lease, acks and stores results, and an async task that blocks
(a sync client called inside a coroutine) would stall all of that; on its own loop it
stalls only the other async tasks, and the lag watch names it. Up to
``worker_child_concurrency`` async tasks run at once there.

Time limits. A soft limit raises ``SoftTimeLimitExceeded`` in the task's thread at its
next bytecode (``PyThreadState_SetAsyncExc``), so not while the thread waits inside C code
(a socket read without a timeout, ``time.sleep``): it is raised when that call returns.
A hard limit cannot be enforced on a thread (nothing can kill one), as in Celery: the
worker warns at start when one is configured. Async tasks get both, raised at the await
they wait in.

Revoke with terminate (``terminate_job``) cancels an async task on the loop thread, at
the await it waits in; it ends ``REVOKED`` (``TaskRevoked`` stored, acknowledged, never
redelivered) and the loop's other tasks go on. One that ignores the cancellation cannot be
stopped here (nothing kills a thread, and the loop is the worker's process): after
``worker_async_kill_grace`` the pool logs so, and the task ends ``REVOKED`` whenever it
returns. A sync task in a thread gets a cooperative abort (``runtime.aborts``): its
``self.is_aborted()`` (``AbortableTask``) turns True, and if it stops there it ends
``REVOKED``; one that never looks runs to its end.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import threading
from collections import deque
from typing import TYPE_CHECKING

import orjson

from ... import states
from ...errors import SoftTimeLimitExceeded
from ...runtime import aborts
from ...runtime.aio import new_loop
from ...runtime.progress import ProgressReporter
from ..execute import Job, Outcome, execute, is_async
from ..timer import Entry, Timer
from .aio import OnOutcome, TaskSet, revoked_outcome
from .base import Pool

if TYPE_CHECKING:
    from ...app import Celeriac

logger = logging.getLogger("celeriac.worker.pool.threads")


class ThreadsPool(Pool):
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.clock: Timer = self.timer or Timer(self.loop)
        self.child_concurrency = self.app.settings.worker_child_concurrency
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._waiting: deque[tuple[Job, float | None]] = deque()
        """Sync jobs submitted and not yet taken by a thread."""
        self._current: dict[int, Job] = {}
        """Thread ident -> the sync job it runs (read under the lock by the soft limit)."""
        self._sync: dict[int, Job] = {}
        """Sync jobs in the pool (waiting or running), by seq."""
        self._async: dict[int, Job] = {}
        """Async jobs in the pool, by seq: on the loop, or waiting for room there."""
        self._async_waiting: deque[tuple[Job, float | None, float | None]] = deque()
        self._async_until = 0.0
        """Loop time until which the prefetch counts the loop's room (``capacity``)."""
        self._limits: dict[int, Entry] = {}
        self._revoking: dict[int, Entry] = {}
        """Async jobs cancelled by a revoke with terminate, by seq: the grace timer."""
        self._stopping = False
        self._terminated = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._threads = [threading.Thread(target=self._work, name=f"celeriac-thread-{i}",
                                          daemon=True) for i in range(self.concurrency)]
        for t in self._threads:
            t.start()
        self._aio: _LoopThread | None = None
        # update_state's reports (task events only), as the solo pool sends them: calls
        # on the worker's loop, in order with the outcome's.
        self._reporter = ProgressReporter(self._send_progress) if self.task_events else None
        warn_hard_limits(self.app)
        self.app.hooks.call("worker_process_init")

    # -- slots ----------------------------------------------------------------------------
    def free_slots(self) -> int:
        # N threads, and while async tasks run the loop's room too. The consumer cannot
        # choose a job's kind, so a job may take the other kind's slot: it then waits in
        # the pool (a sync job for a thread, an async one for room on the loop; a warm
        # stop hands both back). The total never passes the two together.
        room = self.concurrency + (self.child_concurrency if self._async else 0)
        return max(0, room - len(self._sync) - len(self._async))

    def capacity(self) -> int:
        # As prefork's: counted for a while after the last async job, or a drain of
        # short ones would be fetched for a few at a time.
        recent = self._async or self.loop.time() < self._async_until
        return self.concurrency + (self.child_concurrency if recent else 0)

    def running(self) -> list[Job]:
        return [*self._sync.values(), *self._async.values()]

    def submit(self, job: Job) -> None:
        self._idle.clear()
        hard, soft = self.limits(job)
        if is_async(self.app, job.headers):
            self._async[job.seq] = job
            self._async_until = self.loop.time() + 2.0
            if len(self._async) - len(self._async_waiting) > self.child_concurrency:
                self._async_waiting.append((job, soft, hard))
            else:
                self._start_async(job, soft, hard)
            return
        self._sync[job.seq] = job
        with self._lock:
            self._waiting.append((job, soft))
            self._ready.notify()

    # -- sync jobs: the threads -----------------------------------------------------------
    def _work(self) -> None:
        me = threading.get_ident()
        while True:
            with self._lock:
                while not self._waiting and not self._stopping:
                    self._ready.wait()
                if not self._waiting:
                    return
                job, soft = self._waiting.popleft()
                self._current[me] = job
            reporter = self._reporter
            if reporter is not None:
                reporter.begin(job.headers["id"])
            try:
                self._call(self._begun, job, soft, me)
                outcome = execute(self.app, job, self.task_events)
                if aborts.clear(job.headers["id"]):
                    outcome = self._aborted(job, outcome)
            except SoftTimeLimitExceeded as exc:  # raised outside the task's body
                outcome = Outcome("ack", None, repr(exc))
            except BaseException as exc:  # reported; the thread goes on
                logger.exception("Task %s[%s] crashed its thread", job.headers.get("task"),
                                 job.headers.get("id"))
                outcome = Outcome("requeue", reason=repr(exc))
            finally:
                # Under the lock: the soft limit checks ``_current`` under it too, so it
                # never raises in this thread once the job has left it.
                with self._lock:
                    self._current.pop(me, None)
                if reporter is not None:
                    reporter.end(job.headers["id"])  # before the outcome, as everywhere
            if not self._call(self._done, job, outcome):
                return

    def _call(self, fn: object, *args: object) -> bool:
        try:
            self.loop.call_soon_threadsafe(fn, *args)  # type: ignore[arg-type]
        except RuntimeError:  # the loop is closed: the worker is gone (terminated)
            return False
        return True

    def _send_progress(self, task_id: str, state: str, meta: bytes) -> None:
        self._call(self._progress, task_id, state, orjson.loads(meta))

    def _progress(self, task_id: str, state: str, meta: object) -> None:
        if not self._terminated:
            self.client.on_job_progress(task_id, state, meta)

    def _begun(self, job: Job, soft: float | None, ident: int) -> None:
        if self._terminated or job.seq not in self._sync:
            return
        self.client.on_job_started(job)
        if soft:
            self._limits[job.seq] = self.clock.call_after(soft, self._soft_limit, job, ident)

    def _soft_limit(self, job: Job, ident: int) -> None:
        with self._lock:
            if self._current.get(ident) is not job:
                return  # it ended as the limit came
            logger.warning("Task %s[%s] soft time limit exceeded; raising it in its thread",
                           job.headers["task"], job.headers["id"])
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(ident), ctypes.py_object(SoftTimeLimitExceeded))

    def _done(self, job: Job, outcome: Outcome) -> None:
        aborts.clear(job.headers["id"])  # an abort asked as it ended, after its thread looked
        entry = self._limits.pop(job.seq, None)
        if entry is not None:
            entry.cancel()
        if self._terminated or self._sync.pop(job.seq, None) is None:
            return
        self._settled(job, outcome)

    # -- async jobs: the loop thread ------------------------------------------------------
    def _start_async(self, job: Job, soft: float | None, hard: float | None) -> None:
        if self._aio is None:
            self._aio = _LoopThread(self.app, self.task_events, self._async_done,
                                    self._reporter)
        self.client.on_job_started(job)
        self._aio.start(job, soft, hard)

    def _async_done(self, job: Job, outcome: Outcome) -> None:
        # On the loop thread: over to the worker's loop.
        self._call(self._async_settled, job, outcome)

    def _async_settled(self, job: Job, outcome: Outcome) -> None:
        entry = self._revoking.pop(job.seq, None)
        if entry is not None:
            entry.cancel()
        if self._terminated or self._async.pop(job.seq, None) is None:
            return
        if self._async_waiting:
            self._start_async(*self._async_waiting.popleft())
        if outcome.state == states.REVOKED:  # cancelled by terminate_job
            outcome = revoked_outcome(self.app, job, outcome.reason or "terminated",
                                      self.task_events)
        self._settled(job, outcome)

    # -- revoke with terminate ------------------------------------------------------------
    def terminate_job(self, task_id: str, signum: int) -> bool:
        """Cancel async task ``task_id`` on the loop thread (``signum`` is not used: no
        process is signalled); False if it waits for room there (it is cancelled as it
        starts). A sync task's thread cannot be stopped: it is asked to (an abort)."""
        for job in self._async.values():
            if job.headers["id"] != task_id:
                continue
            if self._aio is None or any(w[0] is job for w in self._async_waiting):
                return False
            if job.seq not in self._revoking:
                self._revoking[job.seq] = self.clock.call_after(
                    self.app.settings.worker_async_kill_grace, self._cancel_ignored, job)
                self._aio.cancel(job.seq)
            return True
        for job in self._sync.values():
            if job.headers["id"] == task_id:
                # A thread cannot be killed: the task is asked to stop (its
                # ``self.is_aborted()``) and ends REVOKED if it does (``_aborted``).
                logger.warning("Task %s[%s] revoked: asking it to stop (a cooperative "
                               "abort: a thread cannot be killed)", job.headers["task"],
                               task_id)
                aborts.request(task_id)
                return True
        return False

    def _aborted(self, job: Job, outcome: Outcome) -> Outcome:
        """In the task's thread (its chord part is counted here, off the loop): a task
        asked to stop that did (``AbortableTask`` ends such a run with nothing done
        after it: no state, acknowledged) ends REVOKED; one that ran on to its end
        keeps its outcome, whose follow-ups were sent."""
        if outcome.state is None and outcome.action == "ack":
            return revoked_outcome(self.app, job, "terminated: aborted on the threads pool",
                                   self.task_events)
        logger.warning("Task %s[%s] was asked to stop (revoked with terminate) and ran to "
                       "its end: it keeps its outcome (%s)", job.headers["task"],
                       job.headers["id"], outcome.state)
        return outcome

    def _cancel_ignored(self, job: Job) -> None:
        self._revoking.pop(job.seq, None)
        if job.seq in self._async:
            logger.error("Task %s[%s] still running %ss after it was cancelled (revoked "
                         "with terminate): it ignores the cancellation or blocks the loop, "
                         "and a thread cannot be killed; it ends REVOKED when it returns",
                         job.headers["task"], job.headers["id"],
                         self.app.settings.worker_async_kill_grace)

    def _settled(self, job: Job, outcome: Outcome) -> None:
        if not self._sync and not self._async:
            self._idle.set()
        self.client.on_job_done(job, outcome)

    # -- stopping -------------------------------------------------------------------------
    async def recall_queued(self) -> None:
        with self._lock:
            # Jobs that went to a free thread count as started (the contract) even if
            # the thread has not taken them yet: only those beyond the threads go back.
            keep = max(0, self.concurrency - len(self._current))
            back = list(self._waiting)[keep:]
            for _ in back:
                self._waiting.pop()
        for job, _soft in reversed(back):  # each goes first in line: last one first
            del self._sync[job.seq]
            self.client.on_job_returned(job)
        while self._async_waiting:
            job = self._async_waiting.pop()[0]
            del self._async[job.seq]
            self.client.on_job_returned(job)
        if not self._sync and not self._async:
            self._idle.set()

    async def join(self) -> None:
        await self._idle.wait()

    async def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._ready.notify_all()
        for t in self._threads:
            await asyncio.to_thread(t.join, 5.0)
        if self._aio is not None:
            await asyncio.to_thread(self._aio.stop)

    async def terminate(self) -> None:
        # Threads cannot be killed: running jobs are abandoned (their messages are given
        # back by the cold stop) and the daemon threads die with the process.
        self._terminated = True
        with self._lock:
            self._stopping = True
            self._waiting.clear()
            self._ready.notify_all()
        self._sync.clear()
        self._async.clear()
        for timers in (self._limits, self._revoking):
            for entry in timers.values():
                entry.cancel()
            timers.clear()
        if self._aio is not None:
            self._aio.stop(wait=False)


class _LoopThread:
    """An event loop in a thread of its own, running async jobs (a ``TaskSet``)."""

    def __init__(self, app: Celeriac, task_events: bool, on_outcome: OnOutcome,
                 reporter: ProgressReporter | None) -> None:
        self.loop = new_loop()
        self.tasks = TaskSet(app, self.loop, on_outcome, task_events=task_events,
                             reporter=reporter, where="the threads pool's event loop")
        self.thread = threading.Thread(target=self._run, name="celeriac-async", daemon=True)
        self.thread.start()
        self.loop.call_soon_threadsafe(self.tasks.lag.start)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self, job: Job, soft: float | None, hard: float | None) -> None:
        self.loop.call_soon_threadsafe(self.tasks.start, job, soft, hard)

    def cancel(self, seq: int) -> None:
        # In order behind its start: the loop finds it running (or ended).
        self.loop.call_soon_threadsafe(self.tasks.cancel, seq)

    def stop(self, wait: bool = True) -> None:
        """Stop the loop (its tasks abandoned, if any) and, with ``wait``, close it."""
        self.tasks.lag.close()  # a stopped loop's silence is not lag
        self.loop.call_soon_threadsafe(self.loop.stop)
        if not wait:
            return
        self.thread.join(5.0)
        if not self.thread.is_alive():
            self.loop.close()


def warn_hard_limits(app: Celeriac) -> None:
    """A hard time limit cannot be enforced on a thread: say so at start, once."""
    named = sorted(t.name for t in app.tasks.values()
                   if t.options.time_limit and not t.is_async)
    if app.settings.task_time_limit or named:
        where = "task_time_limit" if app.settings.task_time_limit else \
            f"time_limit on {', '.join(named[:5])}{' ...' if len(named) > 5 else ''}"
        logger.warning(
            "the threads pool cannot enforce hard time limits (%s): a sync task past its "
            "limit runs on (a thread cannot be killed); soft limits are raised in the "
            "task's thread, and async tasks are cancelled at either. Use the prefork pool "
            "for hard limits.", where)
