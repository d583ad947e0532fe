"""Sentry for celeriac: failing tasks reported once, the trace carried from the producer.

::

    import sentry_sdk
    from celeriac.contrib.sentry import CeleriacIntegration

    sentry_sdk.init(dsn=..., integrations=[CeleriacIntegration()], traces_sample_rate=0.1)

An integration in sentry-sdk's sense (``Integration``, ``setup_once``): ``setup_once``
installs ``Hooks`` (``celeriac.hooks``) for every app of the process, which act only
while the current client has this integration. Initialise Sentry where the app is
defined, so that pool children, forked from the worker, have it too.

- A task run that ends in ``FAILURE`` is reported once, with the task's name, id,
  arguments, retries, queue and worker (``extra["celery-job"]``, tag
  ``celery_task_id``, as Sentry's Celery integration writes them). A run that is retried
  (``self.retry()``, ``autoretry_for``) is not reported: only the last one's failure is.
  Keyword arguments pass through the client's ``event_scrubber`` (its deny-list, e.g.
  ``password``, ``token``, ``api_key``); positional ones are shown only with
  ``send_default_pii`` (they have no name to judge by). With the SDK's
  ``data_collection`` option, its ``queues`` flag decides instead.
- Each run is a transaction (``op`` ``queue.task.celeriac``, a ``queue.process`` span
  around the task) continuing the trace of the code that sent it: ``delay()`` makes a
  ``queue.publish`` span in the current transaction and adds Sentry's ``sentry-trace``
  and ``baggage`` headers, and so does a worker for what a task sends after it (chains,
  chord bodies).
"""

from __future__ import annotations

import copy
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import sentry_sdk
import sentry_sdk.utils as sentry_utils
from sentry_sdk.integrations import Integration
from sentry_sdk.scope import add_global_event_processor, should_send_default_pii
from sentry_sdk.utils import capture_internal_exceptions, event_from_exception

from .. import hooks as _hooks
from .. import states
from ..hooks import Hooks

if TYPE_CHECKING:
    from sentry_sdk._types import Event, Hint

    from ..protocol import Message
    from ..tasks import Request
    from ..worker import Worker

__all__ = ["ENQUEUED_HEADER", "FILTERED", "OP_PROCESS", "OP_PUBLISH", "OP_TASK",
           "CeleriacIntegration", "SentryHooks"]

OP_TASK = "queue.task.celeriac"
"""A task run's transaction ``op``."""
OP_PROCESS = "queue.process"
"""The span around the run in it (Sentry's Queues pages read it)."""
OP_PUBLISH = "queue.publish"
"""A publish's span, in the sender's transaction."""
ENQUEUED_HEADER = "sentry-task-enqueued-time"
"""When the message was sent (epoch seconds; Sentry's Celery integration's header): the
run's ``messaging.message.receive.latency``."""
PENDING_LIMIT = 10_000
"""Publish spans waiting for their ``after_publish``."""
_RUN = "_celeriac_sentry_run"
"""Where the run's scope and transaction live on the request, between the hooks."""
FILTERED = "[Filtered]"
"""What Sentry shows in place of data it withholds."""
_FAILURE_LOG = ("celeriac.worker.execute", "Task %s[%s] failed in ")
"""The logger and the start of the line a worker logs a task's failure with: as an
event (Sentry's logging integration) it would report the failure a second time."""


class CeleriacIntegration(Integration):
    """``sentry_sdk.init(integrations=[CeleriacIntegration()])``.

    ``propagate_traces``: add the trace headers to the messages sent."""

    identifier = "celeriac"
    origin = f"auto.queue.{identifier}"

    def __init__(self, propagate_traces: bool = True) -> None:
        self.propagate_traces = propagate_traces

    @staticmethod
    def setup_once() -> None:
        _hooks.add_global(HOOKS)
        add_global_event_processor(_drop_failure_log)


def _drop_failure_log(event: Event, hint: Hint) -> Event | None:
    """The failure's log line is not an event (the failure is one already); the
    worker's other errors are."""
    if _integration() is not None and event.get("logger") == _FAILURE_LOG[0]:
        message = (event.get("logentry") or {}).get("message")
        if isinstance(message, str) and message.startswith(_FAILURE_LOG[1]):
            return None
    return event


def _integration() -> CeleriacIntegration | None:
    return sentry_sdk.get_client().get_integration(CeleriacIntegration)


class SentryHooks(Hooks):
    """The hooks ``CeleriacIntegration`` installs; they act only while the current
    client has the integration."""

    def __init__(self) -> None:
        self._pending: OrderedDict[str, Any] = OrderedDict()

    def before_publish(self, message: Message, queue: str) -> None:
        integration = _integration()
        if integration is None:
            return
        headers = message.headers
        span = None
        if sentry_sdk.get_current_span() is not None:
            span = sentry_sdk.start_span(op=OP_PUBLISH, name=headers["task"],
                                         origin=CeleriacIntegration.origin)
            _messaging_data(span, headers["id"], str(queue), int(headers.get("retries") or 0))
            self._keep(headers["id"], span)
        if not integration.propagate_traces:
            return
        traceparent = span.to_traceparent() if span is not None \
            else sentry_sdk.get_traceparent()
        if traceparent:
            headers["sentry-trace"] = traceparent
        baggage = sentry_sdk.get_baggage()
        if baggage:
            # Another tracer's W3C baggage may be there: keep its entries, not Sentry's.
            theirs = [item for item in str(headers.get("baggage") or "").split(",")
                      if item.strip() and not item.strip().startswith("sentry-")]
            headers["baggage"] = ",".join([*theirs, baggage])
        headers[ENQUEUED_HEADER] = time.time()

    def _keep(self, task_id: str, span: Any) -> None:
        pending = self._pending
        old = pending.pop(task_id, None)
        if old is not None:
            old.finish()
        pending[task_id] = span
        while len(pending) > PENDING_LIMIT:  # their publish raised: no after_publish
            pending.popitem(last=False)[1].finish()

    def after_publish(self, message: Message, queue: str) -> None:
        span = self._pending.pop(message.headers["id"], None)
        if span is not None:
            span.finish()

    def before_task(self, request: Request) -> None:
        if _integration() is None:
            return
        isolation = sentry_sdk.isolation_scope()
        scope = isolation.__enter__()
        spans: list[Any] = []
        try:
            scope.clear_breadcrumbs()
            scope.add_event_processor(_event_processor(request))
            if not request.is_eager:  # an eager call stays in its caller's trace
                continued = sentry_sdk.continue_trace(
                    dict(request.headers), op=OP_TASK, name=request.task,
                    source="task", origin=CeleriacIntegration.origin)
                transaction = sentry_sdk.start_transaction(continued, custom_sampling_context={
                    "celeriac_job": {"task": request.task}})
                spans.append(transaction.__enter__())
                process = sentry_sdk.start_span(op=OP_PROCESS, name=request.task,
                                                origin=CeleriacIntegration.origin)
                spans.append(process.__enter__())
                _messaging_data(process, request.id, _queue(request), request.retries)
                enqueued = request.headers.get(ENQUEUED_HEADER)
                if isinstance(enqueued, (int, float)):
                    process.set_data("messaging.message.receive.latency",
                                     max(0.0, time.time() - enqueued) * 1000)
        except BaseException:
            for span in reversed(spans):
                span.__exit__(None, None, None)
            isolation.__exit__(None, None, None)
            raise
        vars(request)[_RUN] = (isolation, spans)

    def after_task(self, request: Request, state: str, retval: Any) -> None:
        run = vars(request).pop(_RUN, None)
        if run is None:
            return
        isolation, spans = run
        try:
            failed = state == states.FAILURE and isinstance(retval, BaseException)
            for span in spans:
                span.set_status("internal_error" if failed else
                                "aborted" if state == states.RETRY else "ok")
            if failed:
                client = sentry_sdk.get_client()
                event, hint = event_from_exception(
                    retval, client_options=client.options,
                    mechanism={"type": CeleriacIntegration.identifier, "handled": False})
                sentry_sdk.capture_event(event, hint=hint)
        finally:
            for span in reversed(spans):
                span.__exit__(None, None, None)
            isolation.__exit__(None, None, None)

    def worker_process_shutdown(self) -> None:
        sentry_sdk.flush()

    def after_worker_stop(self, worker: Worker) -> None:
        sentry_sdk.flush()


HOOKS = SentryHooks()
"""The one instance ``setup_once`` installs (``celeriac.hooks.remove_global(HOOKS)``
uninstalls it)."""


def _messaging_data(span: Any, task_id: str, queue: str, retries: int) -> None:
    span.set_data("messaging.system", "celeriac")
    span.set_data("messaging.message.id", task_id)
    span.set_data("messaging.destination.name", queue)
    span.set_data("messaging.message.retry.count", retries)


def _queue(request: Request) -> str:
    return str((request.delivery_info or {}).get("queue") or "")


def _event_processor(request: Request) -> Any:
    def process(event: Event, hint: Hint) -> Event:
        with capture_internal_exceptions():
            event.setdefault("tags", {})["celery_task_id"] = request.id
            args, kwargs = _arguments(request)
            event.setdefault("extra", {})["celery-job"] = {
                "task_name": request.task, "task_id": request.id, "args": args,
                "kwargs": kwargs, "retries": request.retries, "queue": _queue(request),
                "hostname": request.hostname, "root_id": request.root_id,
                "parent_id": request.parent_id}
        return event
    return process


def _data_collection(options: dict[str, Any]) -> bool:
    """Whether the user gave the SDK's ``data_collection`` option (newer sentry-sdk
    versions have it)."""
    configured = getattr(sentry_utils, "has_data_collection_enabled", None)
    return bool(configured(options)) if configured is not None else False


def _arguments(request: Request) -> tuple[Any, Any]:
    """The arguments as the client's options let them be shown (the module's doc)."""
    options = sentry_sdk.get_client().options
    args, kwargs = list(request.args or ()), dict(request.kwargs or {})
    if _data_collection(options):
        if options["data_collection"].get("queues"):
            return args, kwargs
        return FILTERED, FILTERED
    scrubber = options.get("event_scrubber")
    if scrubber is not None:
        try:  # the task's own objects are not to be changed
            kwargs = copy.deepcopy(kwargs)
        except Exception:
            kwargs = {key: repr(value) for key, value in kwargs.items()}
        scrubber.scrub_dict(kwargs)
    if args and not should_send_default_pii():
        return FILTERED, kwargs
    return args, kwargs
