"""The pool interface: where the worker's main process sends jobs to be executed.

The consumer submits a ``Job`` while ``free_slots() + queue_slots() > 0`` and is told,
on the event loop, of the job and its ``Outcome`` when the job is done. A free slot
starts the job now; a queue slot (prefork's lookahead) holds it behind a running job, and
the pool hands it back (``on_job_returned``) if it cannot start it after all. Other
prefetched messages wait in the consumer, where shutdown can give them back.

A pool reports to one ``PoolClient`` (the consumer), every report a method of it: one
object to read for what a pool can say, and nothing a pool or a test can leave half set.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..execute import Job, Outcome
from ..timer import Timer

if TYPE_CHECKING:
    from ...app import Celeriac

logger = logging.getLogger("celeriac.worker.pool")


class PoolClient(Protocol):
    """Where a pool reports (the consumer), always on the event loop."""

    def on_job_done(self, job: Job, outcome: Outcome) -> None:
        """``job`` ended; ``outcome`` says what to do with its message. The slot it held
        is open again: the client dispatches from here."""

    def on_slot(self) -> None:
        """A slot may have opened outside ``on_job_done`` (a child came up)."""

    def on_job_started(self, job: Job) -> None:
        """``job`` started running (task events, revoke with terminate)."""

    def on_job_returned(self, job: Job) -> None:
        """The pool took ``job`` but never started it and cannot start it now."""

    def on_job_progress(self, task_id: str, state: str, meta: Any) -> None:
        """A running task's ``update_state`` (meta as JSON made it; throttled where the
        task runs), only while the pool's ``task_events`` is on."""

    def on_fatal(self, reason: str) -> None:
        """The pool cannot go on (a restart storm): the worker must stop."""


class NullClient:
    """A client that takes no notice: a pool's until one is attached, and a pool's used
    alone (tests, benchmarks). A fatal report is never dropped: it goes to ``fail`` (the
    worker's, so a restart storm before the consumer attached still stops the worker),
    else to the log."""

    def __init__(self, fail: Callable[[str], None] | None = None) -> None:
        self._fail = fail

    def on_job_done(self, job: Job, outcome: Outcome) -> None:
        pass

    def on_slot(self) -> None:
        pass

    def on_job_started(self, job: Job) -> None:
        pass

    def on_job_returned(self, job: Job) -> None:
        pass

    def on_job_progress(self, task_id: str, state: str, meta: Any) -> None:
        pass

    def on_fatal(self, reason: str) -> None:
        if self._fail is not None:
            self._fail(reason)
        else:
            logger.critical("the pool cannot go on: %s", reason)


class Pool(abc.ABC):
    def __init__(self, app: Celeriac, concurrency: int, *, timer: Timer | None = None,
                 client: PoolClient | None = None) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency!r}")
        self.app = app
        self.concurrency = concurrency
        self.timer = timer
        """The worker's Timer (time limits, the supervisor's tick); a pool made without
        one makes its own when it starts."""
        self.client: PoolClient = client or NullClient()
        """Where the pool reports (``attach``)."""
        self.task_events = False
        """Set before ``start``: outcomes carry what task events show (result and
        exception reprs, tracebacks); off, the executing processes skip that work."""

    def attach(self, client: PoolClient) -> None:
        """Report to ``client`` from now on (the consumer, once it exists: the pool
        starts before it)."""
        self.client = client

    def limits(self, job: Job) -> tuple[float | None, float | None]:
        """The job's (hard, soft) time limits: the message's ``timelimit`` header, else
        the task's own, else the settings' (Celery's order)."""
        limits = job.headers.get("timelimit") or (None, None)
        task = self.app.tasks.get(job.headers["task"])
        s = self.app.settings
        hard = limits[0] or (task and task.options.time_limit) or s.task_time_limit
        soft = limits[1] or (task and task.options.soft_time_limit) or s.task_soft_time_limit
        return hard, soft

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    def submit(self, job: Job) -> None:
        """Start ``job``; only called while ``free_slots() > 0``."""

    @abc.abstractmethod
    def free_slots(self) -> int:
        """Jobs that would start at once."""

    def capacity(self) -> int:
        """Tasks it can run at once now, what the consumer's prefetch follows: the
        concurrency, more while ``async def`` tasks run (a prefork child or the threads
        pool's loop runs up to ``worker_child_concurrency`` of them)."""
        return self.concurrency

    def queue_slots(self) -> int:
        """Jobs that would wait behind a running one (a lookahead); 0 if none."""
        return 0

    async def recall_queued(self) -> None:
        """Hand back (``on_job_returned``) every job waiting behind a running one, so that a
        warm stop can give its message back; take no more of them."""

    @abc.abstractmethod
    def running(self) -> list[Job]:
        """Jobs submitted and not yet reported done."""

    @abc.abstractmethod
    async def join(self) -> None:
        """Wait until every running job is reported done."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop after running jobs finish (call ``join`` first for a warm stop)."""

    @abc.abstractmethod
    async def terminate(self) -> None:
        """Stop now; running jobs are abandoned and never reported done."""
