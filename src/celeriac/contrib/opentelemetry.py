"""OpenTelemetry for celeriac: spans for publish, receive and run, the trace context in
the message headers, and task metrics.

::

    from celeriac.contrib.opentelemetry import CeleriacInstrumentor

    CeleriacInstrumentor().instrument(app=app)   # every app of the process: no app=

It is made of ``Hooks`` (``celeriac.hooks``), so it runs wherever tasks run: pool
children (prefork), the threads and solo pools, ``async def`` tasks. Nothing imports
this module unless you do: with it off, no ``opentelemetry`` module is loaded.

The spans follow OpenTelemetry's semantic conventions for messaging:

- ``publish <task>`` (kind ``PRODUCER``, ``messaging.operation.type`` ``send``), in the
  process that sends: ``delay()``, and in a worker what a task sends after it (its
  chain's next step, a chord's body, callbacks), whose parent is the running task's span.
  Its context travels in the message headers (W3C ``traceparent``, ``tracestate``,
  ``baggage``: the global propagator's fields).
- ``receive <task>`` (kind ``CLIENT``, ``receive``), in the worker's main process when
  the message is accepted; its parent is the message's publish span.
- ``run <task>`` (kind ``CONSUMER``, ``process``), around the task where it runs (its
  follow-ups are sent inside it); its parent is the message's publish span.

Spans are named after the task rather than the queue (the conventions'
``{operation} {destination}``): in a task queue the task is what a reader of a trace
looks for, and the queue is in ``messaging.destination.name``.

Metrics: ``celeriac.task.runs`` (by task and final state of the run), ``celeriac.task
.failures`` (by task and ``error.type``), ``messaging.process.duration`` (run time, in
seconds), ``celeriac.task.queue_wait`` (seconds from publish, or from the eta when
later, to the start of the run: the publisher's clock against the worker's).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from opentelemetry import context as otel_context
from opentelemetry import metrics, propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from .. import hooks as _hooks
from .. import states
from ..__about__ import __version__
from ..hooks import Hooks

if TYPE_CHECKING:
    from ..app import Celeriac
    from ..protocol import Message
    from ..tasks import Request
    from ..worker import Worker

__all__ = ["PUBLISHED_HEADER", "CeleriacInstrumentor", "TracingHooks"]

logger = logging.getLogger("celeriac.contrib.opentelemetry")

SYSTEM = "celeriac"
"""``messaging.system``."""
PUBLISHED_HEADER = "celeriac_published"
"""The header holding when the message was published (epoch seconds): the queue wait's
start."""
PENDING_LIMIT = 10_000
"""Publish spans waiting for their ``after_publish``; past it the oldest are ended (their
publish raised, so ``after_publish`` never came)."""
_RUN = "_celeriac_otel_run"
"""Where the run's span and context token live on the request, between the hooks."""


class TracingHooks(Hooks):
    """The hooks ``CeleriacInstrumentor`` installs."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None,
                 meter_provider: metrics.MeterProvider | None = None) -> None:
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.tracer = trace.get_tracer(__name__, __version__, tracer_provider)
        meter = metrics.get_meter(__name__, __version__, meter_provider)
        self.runs = meter.create_counter(
            "celeriac.task.runs", unit="{run}", description="Task runs, by final state")
        self.failures = meter.create_counter(
            "celeriac.task.failures", unit="{run}", description="Task runs that failed")
        self.duration = meter.create_histogram(
            "messaging.process.duration", unit="s", description="Task run time")
        self.queue_wait = meter.create_histogram(
            "celeriac.task.queue_wait", unit="s",
            description="From publish (or the eta) to the start of the run")
        self.sent = meter.create_counter(
            "messaging.client.sent.messages", unit="{message}",
            description="Task messages published")
        self._pending: OrderedDict[str, trace.Span] = OrderedDict()

    # -- producer ------------------------------------------------------------------------
    def before_publish(self, message: Message, queue: str) -> None:
        headers = message.headers
        task_id = headers["id"]
        span = self.tracer.start_span(
            f"publish {headers['task']}", kind=SpanKind.PRODUCER,
            attributes=_attributes(headers, str(queue), "publish", "send"))
        propagate.inject(headers, context=trace.set_span_in_context(span))
        headers[PUBLISHED_HEADER] = time.time()
        pending = self._pending
        old = pending.pop(task_id, None)
        if old is not None:
            old.end()
        pending[task_id] = span
        while len(pending) > PENDING_LIMIT:
            _, lost = pending.popitem(last=False)
            lost.set_status(Status(StatusCode.ERROR, "publish not confirmed"))
            lost.end()

    def after_publish(self, message: Message, queue: str) -> None:
        headers = message.headers
        span = self._pending.pop(headers["id"], None)
        if span is not None:
            span.end()
        self.sent.add(1, {"messaging.system": SYSTEM, "messaging.destination.name": str(queue),
                          "celeriac.task.name": headers["task"]})

    # -- worker's main process -----------------------------------------------------------
    def task_received(self, request: Request) -> None:
        headers = request.headers or {}
        queue = (request.delivery_info or {}).get("queue") or ""
        attributes = _attributes(headers, queue, "receive", "receive")
        if request.hostname:
            attributes["messaging.client.id"] = request.hostname
        span = self.tracer.start_span(f"receive {request.task}", propagate.extract(headers),
                                      kind=SpanKind.CLIENT, attributes=attributes)
        span.end()

    # -- where the task runs -------------------------------------------------------------
    def before_task(self, request: Request) -> None:
        headers = request.headers
        queue = (request.delivery_info or {}).get("queue") or ""
        # An eager call has no headers: its parent is the caller's current span.
        parent = propagate.extract(headers) if headers else otel_context.get_current()
        attributes = _attributes(headers or {"id": request.id, "task": request.task,
                                             "retries": request.retries,
                                             "root_id": request.root_id}, queue,
                                 "run", "process")
        span = self.tracer.start_span(f"run {request.task}", parent, kind=SpanKind.CONSUMER,
                                      attributes=attributes)
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        vars(request)[_RUN] = (span, token, time.monotonic())
        if headers:
            wait = _queue_wait(headers)
            if wait is not None:
                self.queue_wait.record(
                    wait, {"celeriac.task.name": request.task,
                           "messaging.destination.name": queue})

    def after_task(self, request: Request, state: str, retval: Any) -> None:
        run = vars(request).pop(_RUN, None)
        if run is None:
            return
        span, token, started = run
        elapsed = time.monotonic() - started
        try:
            labels: dict[str, str] = {"celeriac.task.name": request.task}
            span.set_attribute("celeriac.task.state", state or "")
            if state == states.FAILURE and isinstance(retval, BaseException):
                error = type(retval).__qualname__
                span.record_exception(retval)
                span.set_status(Status(StatusCode.ERROR, f"{error}: {retval}"))
                span.set_attribute("error.type", error)
                self.failures.add(1, {**labels, "error.type": error})
                labels["error.type"] = error
            elif state == states.RETRY:
                span.add_event("retry", {"celeriac.task.retries": request.retries})
            self.duration.record(elapsed, {
                **labels, "messaging.system": SYSTEM, "messaging.operation.name": "run",
                "messaging.destination.name":
                    (request.delivery_info or {}).get("queue") or ""})
            self.runs.add(1, {"celeriac.task.name": request.task,
                              "celeriac.task.state": state or "IGNORED"})
        finally:
            span.end()
            otel_context.detach(token)

    # -- flushing ------------------------------------------------------------------------
    def worker_process_shutdown(self) -> None:
        self.flush()

    def after_worker_stop(self, worker: Worker) -> None:
        self.flush()

    def flush(self) -> None:
        """Export what the providers buffered (a pool child about to exit)."""
        for provider in (self.tracer_provider or trace.get_tracer_provider(),
                         self.meter_provider or metrics.get_meter_provider()):
            force_flush = getattr(provider, "force_flush", None)
            if force_flush is not None:
                force_flush()


def _attributes(headers: Mapping[str, Any], queue: str, operation: str, kind: str
                ) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.name": operation,
        "messaging.operation.type": kind,
        "messaging.destination.name": queue,
        "messaging.message.id": headers["id"],
        "celeriac.task.name": headers["task"],
        "celeriac.task.retries": int(headers.get("retries") or 0),
    }
    root = headers.get("root_id")
    if root:
        attributes["messaging.message.conversation_id"] = root
    return attributes


def _queue_wait(headers: Mapping[str, Any]) -> float | None:
    """Seconds from the publish (or the eta, when later) to now; None when unknown."""
    published = headers.get(PUBLISHED_HEADER)
    if not isinstance(published, (int, float)):
        return None
    start = float(published)
    eta = headers.get("eta")
    if isinstance(eta, str):
        with contextlib.suppress(ValueError):
            start = max(start, datetime.fromisoformat(eta).timestamp())
    return max(0.0, time.time() - start)


class CeleriacInstrumentor:
    """Turns the tracing on (``instrument``) and off (``uninstrument``), as
    OpenTelemetry's instrumentors do. What is installed is the process's, whichever
    instance installed it: an app (or the process) is instrumented once."""

    _installed: ClassVar[list[tuple[Celeriac | None, TracingHooks]]] = []

    @property
    def is_instrumented(self) -> bool:
        return bool(self._installed)

    def instrument(self, app: Celeriac | None = None, *,
                   tracer_provider: trace.TracerProvider | None = None,
                   meter_provider: metrics.MeterProvider | None = None) -> TracingHooks:
        """Trace ``app`` (None: every app of this process, present and future) with the
        given providers (None: the global ones, resolved when used); the hooks installed.
        Call it where the app is defined, so that pool children, forked from the worker,
        have it too. Instrumenting again what is instrumented changes nothing (logged)."""
        for target, installed in self._installed:
            if target is app:
                logger.warning("%s is instrumented already",
                               "this process" if app is None else f"app {app.main!r}")
                return installed
        hooks = TracingHooks(tracer_provider, meter_provider)
        if app is None:
            _hooks.add_global(hooks)
        else:
            app.add_hooks(hooks)
        self._installed.append((app, hooks))
        return hooks

    def uninstrument(self, app: Celeriac | None = None) -> None:
        """Remove what ``instrument`` installed for ``app`` (None: the global hooks)."""
        for target, hooks in list(self._installed):
            if target is not app:
                continue
            if target is None:
                _hooks.remove_global(hooks)
            else:
                target.hooks.remove(hooks)
            self._installed.remove((target, hooks))
