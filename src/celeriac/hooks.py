"""The one extension mechanism: subclass ``Hooks``, override the methods you need.

Every method is a no-op by default. Hooks are called in the order they were added, from
one place (``HookRunner.call``); a hook that raises is logged and skipped, so an extension
can never break task execution or the worker.

::

    class Timing(Hooks):
        def before_task(self, request):
            request.started = time.monotonic()
        def after_task(self, request, state, retval):
            log.info("%s took %.3fs", request.id, time.monotonic() - request.started)

    app.add_hooks(Timing())
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .protocol import Message
    from .tasks import Request
    from .worker import Worker

logger = logging.getLogger("celeriac.hooks")


class Hooks:
    # Producer side (in the process that calls delay/apply_async).
    def before_publish(self, message: Message, queue: str) -> None:
        """Called before a task message is published; headers may be changed in place."""

    def after_publish(self, message: Message, queue: str) -> None:
        """Called after a task message was handed to the broker."""

    # Execution side (in the process that runs the task).
    def before_task(self, request: Request) -> None:
        """Called before a task runs."""

    def after_task(self, request: Request, state: str, retval: Any) -> None:
        """Called after a task ran, with its final state and return value or exception."""

    def worker_process_init(self) -> None:
        """Called in every process that executes tasks, once, before its first task."""

    def worker_process_shutdown(self) -> None:
        """Called in a pool child as it exits normally (not when it is killed)."""

    # Worker's main process, per message.
    def task_received(self, request: Request) -> None:
        """Called when a task message is accepted (its arguments are not decoded here)."""

    def task_revoked(self, request: Request, expired: bool) -> None:
        """Called when a task is not run because it was revoked or had expired."""

    # Worker side (in the worker's main process).
    def before_worker_start(self, worker: Worker) -> None:
        """Called before the worker's steps start."""

    def after_worker_start(self, worker: Worker) -> None:
        """Called when the worker is consuming."""

    def before_worker_stop(self, worker: Worker) -> None:
        """Called when the worker begins to shut down."""

    def after_worker_stop(self, worker: Worker) -> None:
        """Called when the worker has stopped."""


class HookRunner:
    def __init__(self) -> None:
        self._hooks: list[Hooks] = []

    def add(self, hooks: Hooks) -> None:
        if not isinstance(hooks, Hooks):
            raise TypeError(f"hooks must be a Hooks instance, got {type(hooks).__name__}")
        self._hooks.append(hooks)

    def __bool__(self) -> bool:
        return bool(self._hooks)

    def call_strict(self, name: str, *args: Any) -> None:
        """Call the hooks and let a failure propagate (process initialisation)."""
        for hooks in self._hooks:
            getattr(hooks, name)(*args)

    def call(self, name: str, *args: Any) -> None:
        for hooks in self._hooks:
            try:
                getattr(hooks, name)(*args)
            except Exception:
                logger.exception("hook %s.%s failed", type(hooks).__name__, name)
