"""The app module of test_signals' worker: signals_tasks' app, plus a receiver on each of
Celery's signals recording what it got to Redis, one list per process (keyed by pid).

Receivers are written as Celery integrations write them: keyword style with defaults and
``**kwargs`` (Sentry's), and bound methods reading ``kwargs.get(...)`` (OpenTelemetry's).
``SIGNALS_KEY`` is the key prefix; ``SIGNALS_REDIS`` the Redis URL.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis

from celeriac import signals
from tests.integration.signals_tasks import app

__all__ = ["app"]

PREFIX = os.environ["SIGNALS_KEY"]
_clients: dict[int, redis.Redis] = {}


def record(name: str, **fields: Any) -> None:
    pid = os.getpid()
    client = _clients.get(pid)
    if client is None:  # one connection per process: a forked child opens its own
        client = _clients[pid] = redis.Redis.from_url(
            os.environ.get("SIGNALS_REDIS", "redis://127.0.0.1:6379/0"))
    entry = {"signal": name, "pid": pid, "ppid": os.getppid(), "t": time.monotonic(),
             **fields}
    client.sadd(f"{PREFIX}:pids", pid)
    client.rpush(f"{PREFIX}:pid:{pid}", json.dumps(entry, default=repr))


def _name(obj: Any) -> Any:
    return getattr(obj, "name", obj)


# -- Sentry's style: named keywords with defaults, **kwargs for the rest ------------------

@signals.before_task_publish.connect(weak=False, dispatch_uid="rec-before-publish")
def on_before_publish(sender: Any = None, headers: Any = None, body: Any = None,
                      **kwargs: Any) -> None:
    record("before_task_publish", sender=sender, task_id=headers["id"],
           parent_id=headers.get("parent_id"), routing_key=kwargs.get("routing_key"))


@signals.after_task_publish.connect(weak=False, dispatch_uid="rec-after-publish")
def on_after_publish(sender: Any = None, headers: Any = None, body: Any = None,
                     **kwargs: Any) -> None:
    record("after_task_publish", sender=sender, task_id=headers["id"])


@signals.task_received.connect(weak=False, dispatch_uid="rec-received")
def on_received(sender: Any = None, request: Any = None, **kwargs: Any) -> None:
    record("task_received", task_id=request.id, task=request.task,
           traceparent=dict(request.headers).get("traceparent"))


@signals.task_prerun.connect(weak=False, dispatch_uid="rec-prerun")
def on_prerun(sender: Any = None, task_id: Any = None, task: Any = None, args: Any = None,
              kwargs: Any = None, **kw: Any) -> None:
    record("task_prerun", task_id=task_id, task=task.name, sender=_name(sender),
           args=list(args), kwargs=dict(kwargs), request_id=task.request.id)


@signals.task_success.connect(weak=False, dispatch_uid="rec-success")
def on_success(sender: Any = None, result: Any = None, **kwargs: Any) -> None:
    record("task_success", sender=_name(sender), result=result,
           request_id=sender.request.id)


@signals.task_failure.connect(weak=False, dispatch_uid="rec-failure")
def on_failure(sender: Any = None, task_id: Any = None, exception: Any = None,
               args: Any = None, kwargs: Any = None, traceback: Any = None,
               einfo: Any = None, **kw: Any) -> None:
    record("task_failure", sender=_name(sender), task_id=task_id,
           exception=repr(exception), exc_type=type(exception).__name__,
           args=list(args), kwargs=dict(kwargs),
           einfo_is_exception=einfo.exception is exception,
           einfo_type=einfo.type.__name__, einfo_traceback=str(einfo),
           has_traceback=traceback is not None, request_id=sender.request.id)


@signals.task_retry.connect(weak=False, dispatch_uid="rec-retry")
def on_retry(sender: Any = None, request: Any = None, reason: Any = None, einfo: Any = None,
             **kwargs: Any) -> None:
    record("task_retry", sender=_name(sender), task_id=request.id,
           retries=request.retries, reason=repr(reason),
           einfo_type=einfo.type.__name__ if einfo is not None else None)


@signals.task_postrun.connect(weak=False, dispatch_uid="rec-postrun")
def on_postrun(sender: Any = None, task_id: Any = None, task: Any = None, args: Any = None,
               kwargs: Any = None, retval: Any = None, state: Any = None,
               **kw: Any) -> None:
    record("task_postrun", sender=_name(sender), task_id=task_id, task=task.name,
           state=state, retval=repr(retval), request_id=task.request.id)


@signals.worker_init.connect(weak=False, dispatch_uid="rec-worker-init")
def on_worker_init(sender: Any = None, **kwargs: Any) -> None:
    record("worker_init", hostname=getattr(sender, "hostname", None))


@signals.worker_ready.connect(weak=False, dispatch_uid="rec-worker-ready")
def on_worker_ready(sender: Any = None, **kwargs: Any) -> None:
    record("worker_ready")


@signals.worker_process_init.connect(weak=False, dispatch_uid="rec-process-init")
def on_process_init(sender: Any = None, **kwargs: Any) -> None:
    record("worker_process_init")


@signals.worker_process_shutdown.connect(weak=False, dispatch_uid="rec-process-shutdown")
def on_process_shutdown(sender: Any = None, pid: Any = None, exitcode: Any = None,
                        **kwargs: Any) -> None:
    record("worker_process_shutdown", signal_pid=pid, exitcode=exitcode)


@signals.worker_shutdown.connect(weak=False, dispatch_uid="rec-worker-shutdown")
def on_worker_shutdown(sender: Any = None, **kwargs: Any) -> None:
    record("worker_shutdown")


# -- OpenTelemetry's style: bound methods, everything from kwargs.get(...) ------------------

class OtelStyleInstrumentor:
    def instrument(self) -> None:
        signals.task_prerun.connect(self._trace_prerun, weak=False)
        signals.task_postrun.connect(self._trace_postrun, weak=False)
        signals.task_failure.connect(self._trace_failure, weak=False)
        signals.task_retry.connect(self._trace_retry, weak=False)
        signals.before_task_publish.connect(self._trace_before_publish, weak=False)
        signals.after_task_publish.connect(self._trace_after_publish, weak=False)

    def _trace_prerun(self, *args: Any, **kwargs: Any) -> None:
        task, task_id = kwargs.get("task"), kwargs.get("task_id")
        if task is None or task_id is None:
            return
        setattr(task, "__otel_task_span", {task_id: "span"})  # OTel keeps its spans on the task
        record("otel:task_prerun", task=task.name, task_id=task_id)

    def _trace_postrun(self, *args: Any, **kwargs: Any) -> None:
        task, task_id = kwargs.get("task"), kwargs.get("task_id")
        if task is None or task_id is None:
            return
        spans = getattr(task, "__otel_task_span", {})
        record("otel:task_postrun", task=task.name, task_id=task_id,
               state=kwargs.get("state"), had_span=task_id in spans)

    def _trace_failure(self, *args: Any, **kwargs: Any) -> None:
        task, task_id = kwargs.get("sender"), kwargs.get("task_id")
        ex: Any = kwargs.get("einfo")
        if hasattr(ex, "exception"):
            ex = ex.exception
        record("otel:task_failure", task=_name(task), task_id=task_id,
               exc_type=type(ex).__name__)

    def _trace_retry(self, *args: Any, **kwargs: Any) -> None:
        task, request = kwargs.get("sender"), kwargs.get("request")
        record("otel:task_retry", task=_name(task), task_id=getattr(request, "id", None),
               reason=str(kwargs.get("reason")))

    @staticmethod
    def _message_task_id(kwargs: dict[str, Any]) -> Any:
        headers, body = kwargs.get("headers"), kwargs.get("body")
        if headers:
            return headers.get("id")  # protocol 2
        return body.get("id") if isinstance(body, dict) else None

    def _trace_before_publish(self, *args: Any, **kwargs: Any) -> None:
        record("otel:before_task_publish", task=kwargs.get("sender"),
               task_id=self._message_task_id(kwargs))

    def _trace_after_publish(self, *args: Any, **kwargs: Any) -> None:
        record("otel:after_task_publish", task=kwargs.get("sender"),
               task_id=self._message_task_id(kwargs))


@signals.worker_process_init.connect(weak=False)
def init_tracing(*args: Any, **kwargs: Any) -> None:
    """As OpenTelemetry's docs say: instrument in each pool child once it starts."""
    OtelStyleInstrumentor().instrument()


@signals.setup_logging.connect(weak=False, dispatch_uid="rec-setup-logging")
def configure_logging(loglevel: Any = None, logfile: Any = None, **kwargs: Any) -> None:
    """A receiver here means the worker leaves logging to it (Celery's rule)."""
    import logging
    import sys

    logging.basicConfig(level=loglevel, stream=sys.stderr,
                        format="SIGNALLED %(levelname)s %(name)s: %(message)s")
    record("setup_logging", loglevel=loglevel, logfile=logfile)
