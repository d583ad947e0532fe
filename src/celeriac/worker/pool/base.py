"""The pool interface: where the worker's main process sends jobs to be executed.

The consumer submits a ``Job`` while ``free_slots() + queue_slots() > 0`` and is called
back with the job and its ``Outcome`` on the event loop when the job is done. A free slot
starts the job now; a queue slot (prefork's lookahead) holds it behind a running job, and
the pool hands it back through ``on_returned`` if it cannot start it after all. Other
prefetched messages wait in the consumer, where shutdown can give them back.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..execute import Job, Outcome
from ..timer import Timer

if TYPE_CHECKING:
    from ...app import Celeriac

OnDone = Callable[[Job, Outcome], None]


class PoolClient(Protocol):
    """Where a pool reports: the consumer. It may also have ``on_job_progress(task_id,
    state, meta)``, called for a running task's ``update_state`` while task events are
    on (``attach`` takes it when present)."""

    def on_job_done(self, job: Job, outcome: Outcome) -> None: ...
    def on_slot(self) -> None: ...
    def on_job_started(self, job: Job) -> None: ...
    def on_job_returned(self, job: Job) -> None: ...


class Pool(abc.ABC):
    def __init__(self, app: Celeriac, concurrency: int, *, timer: Timer | None = None,
                 on_fatal: Callable[[str], None] | None = None) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency!r}")
        self.app = app
        self.concurrency = concurrency
        self.timer = timer
        """The worker's Timer (time limits, the supervisor's tick); a pool made without
        one makes its own when it starts."""
        self.on_done: OnDone = lambda job, outcome: None
        """Called with each job and its outcome, on the event loop."""
        self.on_ready: Callable[[], None] = lambda: None
        """Called when a slot may have opened outside ``on_done`` (a child came up)."""
        self.on_started: Callable[[Job], None] = lambda job: None
        """Called when a job starts running (task events)."""
        self.on_returned: Callable[[Job], None] = lambda job: None
        """Called with a job the pool took but never started and cannot start now."""
        self.on_progress: Callable[[str, str, Any], None] = lambda task_id, state, meta: None
        """Called with a running task's ``update_state`` (task id, state, meta as JSON
        made it; throttled where the task runs), only while ``task_events`` is on."""
        self.on_fatal: Callable[[str], None] = on_fatal or (lambda reason: None)
        """Called when the pool cannot go on (a restart storm); the worker stops."""
        self.task_events = False
        """Set before ``start``: outcomes carry what task events show (result and
        exception reprs, tracebacks); off, the executing processes skip that work."""

    def attach(self, client: PoolClient) -> None:
        """Report to ``client`` (the consumer): every callback but ``on_fatal`` is set
        here, in one place."""
        self.on_done = client.on_job_done
        self.on_ready = client.on_slot
        self.on_started = client.on_job_started
        self.on_returned = client.on_job_returned
        self.on_progress = getattr(client, "on_job_progress", self.on_progress)

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
        """Hand back (``on_returned``) every job waiting behind a running one, so that a
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
