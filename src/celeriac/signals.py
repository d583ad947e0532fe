"""Celery's signals, as a thin layer over the one extension mechanism (``Hooks``).

::

    from celeriac.signals import task_failure

    @task_failure.connect
    def report(sender=None, task_id=None, exception=None, **kwargs):
        ...

Receivers get Celery's arguments (``sender`` first, keywords after), so handlers written
for Celery, Sentry's and OpenTelemetry's included, connect unchanged. Nothing is wired
until a receiver connects: then one ``SignalHooks`` joins every app's hooks (present and
future), so an app with no receivers pays nothing. A receiver that raises is logged and
skipped, as any hook.

Celery's names and celeriac's: ``celeryd_init`` is ``worker_configure`` and
``celeryd_after_setup`` is ``worker_after_setup`` (both names work).
"""

from __future__ import annotations

import logging
import os
import threading
import traceback
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

from . import serialization, states
from .hooks import Hooks
from .serialization import compression

if TYPE_CHECKING:
    from .app import Celeriac
    from .protocol import Message
    from .tasks import Request
    from .worker import Worker

logger = logging.getLogger("celeriac.signals")

Receiver = Callable[..., Any]
F = TypeVar("F", bound=Callable[..., Any])


class Signal:
    """A named event with receivers; ``send`` calls each with ``sender`` and keywords."""

    def __init__(self, name: str, providing_args: tuple[str, ...] = ()) -> None:
        self.name = name
        self.providing_args = providing_args
        self._receivers: list[tuple[Any, Receiver, Any]] = []  # (key, receiver, sender)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<Signal {self.name}>"

    @overload
    def connect(self, receiver: F, *, sender: Any = None, weak: bool = False,
                dispatch_uid: Any = None) -> F: ...

    @overload
    def connect(self, receiver: None = None, *, sender: Any = None, weak: bool = False,
                dispatch_uid: Any = None) -> Callable[[F], F]: ...

    def connect(self, receiver: Receiver | None = None, *, sender: Any = None,
                weak: bool = False, dispatch_uid: Any = None) -> Any:
        """``sig.connect(fn)``, ``@sig.connect`` or ``@sig.connect(sender=...)``.

        Receivers are held strongly (``weak`` is accepted for Celery's signature); a
        second connect with the same ``dispatch_uid`` (or function) is ignored."""
        if receiver is None:
            def decorator(fn: Receiver) -> Receiver:
                self.connect(fn, sender=sender, dispatch_uid=dispatch_uid)
                return fn
            return decorator
        if not callable(receiver):
            raise TypeError(f"{self.name}.connect: receiver must be callable, got "
                            f"{receiver!r}")
        key = dispatch_uid if dispatch_uid is not None else receiver
        with self._lock:
            if any(k == key and s == sender for k, _, s in self._receivers):
                return receiver
            self._receivers.append((key, receiver, sender))
        _wire()
        return receiver

    def disconnect(self, receiver: Receiver | None = None, *, sender: Any = None,
                   dispatch_uid: Any = None) -> bool:
        key = dispatch_uid if dispatch_uid is not None else receiver
        with self._lock:
            before = len(self._receivers)
            self._receivers = [r for r in self._receivers if not (r[0] == key and r[2] == sender)]
            return len(self._receivers) != before

    @property
    def receivers(self) -> list[Receiver]:
        return [r for _, r, _ in self._receivers]

    def send(self, sender: Any = None, **named: Any) -> list[tuple[Receiver, Any]]:
        """Call every receiver (those connected for this ``sender`` or for any);
        returns ``(receiver, response)`` pairs. A receiver that raises is logged."""
        out: list[tuple[Receiver, Any]] = []
        for _, receiver, wanted in list(self._receivers):
            if wanted is not None and wanted != sender and getattr(sender, "name", None) != wanted:
                continue
            try:
                out.append((receiver, receiver(signal=self, sender=sender, **named)))
            except Exception as exc:
                logger.exception("signal %s: receiver %r failed", self.name, receiver)
                out.append((receiver, exc))
        return out

    send_robust = send


# Producer side.
before_task_publish = Signal("before_task_publish")
after_task_publish = Signal("after_task_publish")
# Execution side (the process that runs the task).
task_prerun = Signal("task_prerun")
task_postrun = Signal("task_postrun")
task_success = Signal("task_success")
task_failure = Signal("task_failure")
task_retry = Signal("task_retry")
task_internal_error = Signal("task_internal_error")
# Worker's main process.
task_received = Signal("task_received")
task_revoked = Signal("task_revoked")
task_rejected = Signal("task_rejected")
task_unknown = Signal("task_unknown")
worker_configure = Signal("worker_configure")
worker_after_setup = Signal("worker_after_setup")
worker_init = Signal("worker_init")
worker_ready = Signal("worker_ready")
worker_shutting_down = Signal("worker_shutting_down")
worker_shutdown = Signal("worker_shutdown")
worker_process_init = Signal("worker_process_init")
worker_process_shutdown = Signal("worker_process_shutdown")
setup_logging = Signal("setup_logging")
after_setup_logger = Signal("after_setup_logger")

# Celery's names for the same signals.
celeryd_init = worker_configure
celeryd_after_setup = worker_after_setup


class ExceptionInfo:
    """Celery's ``einfo``: the exception, its type and its formatted traceback."""

    def __init__(self, exc: BaseException) -> None:
        self.exception = exc
        self.type = type(exc)
        self.tb = exc.__traceback__
        self.traceback = "".join(traceback.format_exception(exc))

    def __str__(self) -> str:
        return self.traceback


class SignalHooks(Hooks):
    """Sends Celery's signals from the hook points, with Celery's arguments."""

    def __init__(self, app: Celeriac) -> None:
        self.app = app

    def _task(self, request: Request) -> Any:
        return self.app.tasks.get(request.task)

    def _body(self, message: Message) -> Any:
        return _body(message, self.app.settings.max_message_size)

    def before_publish(self, message: Message, queue: str) -> None:
        if before_task_publish._receivers:
            h = message.headers
            before_task_publish.send(
                sender=h.get("task"), body=self._body(message), exchange="",
                routing_key=queue,
                headers=h, properties=message.properties, declare=[], retry_policy=None)

    def after_publish(self, message: Message, queue: str) -> None:
        if after_task_publish._receivers:
            after_task_publish.send(sender=message.headers.get("task"),
                                    body=self._body(message),
                                    headers=message.headers, exchange="", routing_key=queue)

    def task_received(self, request: Request) -> None:
        task_received.send(sender=None, request=request)

    def task_revoked(self, request: Request, expired: bool) -> None:
        task_revoked.send(sender=self._task(request), request=request, terminated=False,
                          signum=None, expired=expired)

    def before_task(self, request: Request) -> None:
        task = self._task(request)
        task_prerun.send(sender=task, task_id=request.id, task=task, args=request.args,
                         kwargs=request.kwargs)

    def after_task(self, request: Request, state: str | None, retval: Any) -> None:
        task = self._task(request)
        if state == states.SUCCESS:
            task_success.send(sender=task, result=retval)
        elif state == states.FAILURE and isinstance(retval, BaseException):
            task_failure.send(sender=task, task_id=request.id, exception=retval,
                              args=request.args, kwargs=request.kwargs,
                              traceback=retval.__traceback__, einfo=ExceptionInfo(retval))
        elif state == states.RETRY:
            exc = retval if isinstance(retval, BaseException) else None
            task_retry.send(sender=task, request=request, reason=retval,
                            einfo=ExceptionInfo(exc) if exc is not None else None)
        task_postrun.send(sender=task, task_id=request.id, task=task, args=request.args,
                          kwargs=request.kwargs, retval=retval, state=state)

    def worker_process_init(self) -> None:
        worker_process_init.send(sender=None)

    def worker_process_shutdown(self) -> None:
        worker_process_shutdown.send(sender=None, pid=os.getpid(), exitcode=0)

    def before_worker_start(self, worker: Worker) -> None:
        conf = worker.app.conf
        worker_configure.send(sender=worker.hostname, instance=worker, conf=conf,
                              options={})
        worker_init.send(sender=worker)
        worker_after_setup.send(sender=worker.hostname, instance=worker, conf=conf)

    def after_worker_start(self, worker: Worker) -> None:
        worker_ready.send(sender=worker)

    def before_worker_stop(self, worker: Worker) -> None:
        worker_shutting_down.send(sender=worker.hostname, sig="SIGTERM", how="Warm",
                                  exitcode=0)

    def after_worker_stop(self, worker: Worker) -> None:
        worker_shutdown.send(sender=worker)


def _body(message: Message, limit: int) -> Any:
    # Celery passes the decoded body; decoding is only paid when someone listens.
    try:
        body, packed = message.body, message.headers.get(compression.HEADER)
        if packed is not None:
            body = compression.decompress(body, packed, limit)
        return serialization.loads(body, message.content_type,
                                   frozenset({message.content_type}))
    except Exception:
        return message.body


_apps: weakref.WeakSet[Celeriac] = weakref.WeakSet()
_wired = False
_wire_lock = threading.Lock()


def install(app: Celeriac) -> None:
    """Called for each app: its hooks get the signals now if any receiver is connected,
    else when the first one connects."""
    with _wire_lock:
        _apps.add(app)
        if _wired:
            app.hooks.add(SignalHooks(app))


def _wire() -> None:
    global _wired
    with _wire_lock:
        if _wired:
            return
        _wired = True
        for app in list(_apps):
            app.hooks.add(SignalHooks(app))
