"""Celery's ``celery.contrib.abortable``: tasks that stop when asked.

Cooperative, as in Celery: the caller's ``AbortableAsyncResult.abort()`` stores the state
``ABORTED`` for the task in the result backend, and the task, which looks now and then
(``self.is_aborted()``), stops itself. Nothing is killed, and a task that never looks
runs to its end (whose result then replaces ``ABORTED``). To stop a task without its
help, revoke it: ``result.revoke(terminate=True)``.

In the threads pool (``-P threads``) that revoke is itself an abort: a thread cannot be
killed, so the pool asks the running task to stop (``celeriac.runtime.aborts``, no round
trip to the backend) and ``is_aborted()`` turns True at once. A run that returns after
it was asked ends ``REVOKED``: its return value is dropped, no chain step or callback
follows, and a chord it belongs to counts it as Celery counts a revoked task.

::

    from celeriac.contrib.abortable import AbortableTask

    @app.task(bind=True, base=AbortableTask)
    def long_task(self, items):
        for item in items:
            if self.is_aborted():
                return "aborted"
            process(item)

    result = long_task.AsyncResult(long_task.delay(items).id)
    result.abort()

It needs a result backend every process reaches (Redis, PostgreSQL, SQLite): the abort
travels through it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from ..errors import Ignore
from ..result import AsyncResult
from ..runtime import aborts
from ..tasks import Task

if TYPE_CHECKING:
    from ..app import Celeriac
    from ..runtime.request import Request

P = ParamSpec("P")
R = TypeVar("R")

ABORTED = "ABORTED"
"""The state ``abort()`` stores; not a final state (``ready()`` stays False)."""


class AbortableAsyncResult(AsyncResult[R]):
    """An ``AsyncResult`` that can ask its task to stop."""

    def is_aborted(self) -> bool:
        """True once ``abort()`` was called (and the task has not finished since)."""
        return self.state == ABORTED

    def abort(self) -> None:
        """Ask the task to stop: store ``ABORTED`` as its state. The task stops when it
        next calls ``is_aborted()``; one that finished already keeps its result."""
        if not self.ready():
            self.app.backend.store(self.id, ABORTED, None)


class AbortableTask(Task[P, R]):
    """A task that can be asked to stop (``base=AbortableTask``): it calls
    ``self.is_aborted()`` where stopping is safe."""

    def AsyncResult(self, task_id: str) -> AbortableAsyncResult[R]:
        """The abortable result of this task's call ``task_id``."""
        return AbortableAsyncResult(task_id, self.app, self.name)

    def is_aborted(self, task_id: str | None = None, app: Celeriac | None = None) -> bool:
        """True when the running call (or call ``task_id``) was asked to stop."""
        task_id = task_id or self.request.id
        if not task_id:
            raise ValueError("is_aborted needs task_id= outside a running task")
        if aborts.requested(task_id):
            return True
        return AbortableAsyncResult[Any](task_id, app or self.app).is_aborted()

    def run_with(self, request: Request, args: Sequence[Any], kwargs: Mapping[str, Any]) -> R:
        value = super().run_with(request, args, kwargs)
        if request.id and aborts.requested(request.id):
            # Asked to stop by a revoke with terminate (threads pool): nothing of this
            # run goes on (Ignore: no state, no follow-ups); the pool stores REVOKED.
            raise Ignore(f"task {request.id} aborted")
        return value


__all__ = ["ABORTED", "AbortableAsyncResult", "AbortableTask"]
