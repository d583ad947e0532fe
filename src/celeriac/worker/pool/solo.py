"""The solo pool: one task at a time, in one executor thread of the worker process.

The task runs off the event loop so that heartbeats (the worker's lease on its messages),
acks and signals are handled while it runs: a long task on a live solo worker keeps its
lease and is never redelivered. The thread is a daemon so that a cold shutdown does not
wait for the task. No time limits are enforced here; use the prefork pool for those.
An ``async def`` task runs to completion on an event loop the thread keeps (one task at a
time, as every task here).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from typing import Any

import orjson

from ...runtime.aio import new_loop
from ...runtime.progress import ProgressReporter
from ..execute import Job, Outcome, execute
from .base import Pool

logger = logging.getLogger("celeriac.worker.pool.solo")

_STOP = None


class SoloPool(Pool):
    async def start(self) -> None:
        if self.concurrency != 1:
            logger.warning("the solo pool runs one task at a time; ignoring concurrency=%d",
                           self.concurrency)
            self.concurrency = 1
        self._loop = asyncio.get_running_loop()
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._current: Job | None = None
        self._terminated = False
        self._idle = asyncio.Event()
        self._idle.set()
        # Progress reports reach the loop as calls, in order with the outcome's: the
        # last report precedes the task's final event. None without task events.
        self._reporter = ProgressReporter(self._send_progress) if self.task_events else None
        self._thread = threading.Thread(target=self._work, name="celeriac-solo", daemon=True)
        self._thread.start()
        self.app.hooks.call("worker_process_init")

    def submit(self, job: Job) -> None:
        self.client.on_job_started(job)
        self._current = job
        self._idle.clear()
        self._jobs.put(job)

    def free_slots(self) -> int:
        return 0 if self._current is not None else 1

    def running(self) -> list[Job]:
        return [self._current] if self._current is not None else []

    def _send_progress(self, task_id: str, state: str, meta: bytes) -> None:
        # Decoded here, in the executor thread: the loop's time is the worker's budget.
        self._loop.call_soon_threadsafe(self._progress, task_id, state, orjson.loads(meta))

    def _progress(self, task_id: str, state: str, meta: Any) -> None:
        if not self._terminated:
            self.client.on_job_progress(task_id, state, meta)

    def _work(self) -> None:
        loop = new_loop()
        try:
            self._serve(loop)
        finally:
            loop.close()

    def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        reporter = self._reporter
        while (job := self._jobs.get()) is not _STOP:
            if reporter is not None:
                reporter.begin(job.headers["id"])
            try:
                outcome = execute(self.app, job, self.task_events, loop)
            except BaseException as exc:
                logger.exception("Task %s[%s] crashed the executor", job.headers.get("task"),
                                 job.headers.get("id"))
                outcome = Outcome("requeue", reason=repr(exc))
            finally:
                if reporter is not None:
                    reporter.end(job.headers["id"])
            try:
                self._loop.call_soon_threadsafe(self._done, job, outcome)
            except RuntimeError:  # the loop is closed: the worker is gone (terminated)
                return

    def _done(self, job: Job, outcome: Outcome) -> None:
        if self._terminated:
            return  # abandoned: its message is given back by the cold stop
        self._current = None
        self._idle.set()
        self.client.on_job_done(job, outcome)

    async def join(self) -> None:
        await self._idle.wait()

    async def stop(self) -> None:
        self._jobs.put(_STOP)
        await asyncio.to_thread(self._thread.join, 5.0)

    async def terminate(self) -> None:
        self._terminated = True
        self._current = None
        self._jobs.put(_STOP)  # the daemon thread dies with the process if still busy
