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

``add_global`` installs hooks for every app of the process, present and future (what an
error tracker's integration does: it is set up before the app exists, and knows none).
Global hooks run before an app's own.
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
        """Called before a task message is published; headers may be changed in place
        (``message.headers``: a tracer adds its context there).

        Also called in the process that runs a task for what it sends after it: its
        chain's next step, its callbacks and errbacks, a chord's body (with the running
        task's request current, between its ``before_task`` and ``after_task``), so a
        context set in ``before_task`` reaches the follow-ups' headers."""

    def after_publish(self, message: Message, queue: str) -> None:
        """Called after a task message was handed to the broker (not if publishing
        raised)."""

    # Execution side (in the process that runs the task).
    def before_task(self, request: Request) -> None:
        """Called before a task runs, in the thread (or, for an ``async def`` task, the
        asyncio task) that runs it and then calls ``after_task``: a context variable set
        here is seen by the task and by what it publishes, until ``after_task`` resets
        it."""

    def after_task(self, request: Request, state: str, retval: Any) -> None:
        """Called after a task ran, with its final state and return value or exception
        (``RETRY`` for a run that will be retried: the last run's state is the final
        one). The follow-ups it sent were published before this call."""

    def worker_process_init(self) -> None:
        """Called in every process that executes tasks, once, before its first task."""

    def worker_process_shutdown(self) -> None:
        """Called in a pool child as it exits normally (not when it is killed): the place
        to flush what it buffered."""

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


_global: list[Hooks] = []
"""Hooks of every app in this process (``add_global``)."""


def add_global(hooks: Hooks) -> None:
    """Install ``hooks`` for every app of this process, present and future (once: adding
    the same instance again does nothing)."""
    if not isinstance(hooks, Hooks):
        raise TypeError(f"hooks must be a Hooks instance, got {type(hooks).__name__}")
    if all(h is not hooks for h in _global):
        _global.append(hooks)


def remove_global(hooks: Hooks) -> None:
    """Uninstall hooks ``add_global`` installed (nothing if they were not)."""
    _global[:] = [h for h in _global if h is not hooks]


class HookRunner:
    def __init__(self) -> None:
        self._hooks: list[Hooks] = []

    def add(self, hooks: Hooks) -> None:
        if not isinstance(hooks, Hooks):
            raise TypeError(f"hooks must be a Hooks instance, got {type(hooks).__name__}")
        self._hooks.append(hooks)

    def remove(self, hooks: Hooks) -> None:
        """Remove hooks ``add`` added (nothing if they were not)."""
        self._hooks = [h for h in self._hooks if h is not hooks]

    def __bool__(self) -> bool:
        return bool(self._hooks) or bool(_global)

    def _all(self) -> list[Hooks]:
        return [*_global, *self._hooks] if _global else self._hooks

    def call_strict(self, name: str, *args: Any) -> None:
        """Call the hooks and let a failure propagate (process initialisation)."""
        for hooks in self._all():
            getattr(hooks, name)(*args)

    def call(self, name: str, *args: Any) -> None:
        for hooks in self._all():
            try:
                getattr(hooks, name)(*args)
            except Exception:
                logger.exception("hook %s.%s failed", type(hooks).__name__, name)
