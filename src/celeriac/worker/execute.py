"""Running one task message in the process that executes it (solo thread or pool child).

``execute`` decodes the body, runs the task, stores its result, and returns an
``Outcome`` that tells the worker's main process what to do with the message. It never
raises for anything a task or a message can do; only shutdown requests propagate.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .. import serialization, states
from ..errors import DecodeError, Ignore, Reject, Retry
from ..protocol import decode_body
from ..tasks import Request

if TYPE_CHECKING:
    from ..app import Celeriac

logger = logging.getLogger("celeriac.worker.execute")


@dataclass(frozen=True, slots=True)
class Job:
    """A message as the pool receives it: the body is still undecoded bytes."""

    id: int
    headers: dict[str, Any]
    body: bytes
    content_type: str
    queue: str
    delivery_count: int
    hostname: str


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the main process does with the message after the task ran."""

    action: Literal["ack", "requeue", "dead_letter"]
    state: str | None = None
    reason: str | None = None
    runtime: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def execute(app: Celeriac, job: Job) -> Outcome:
    headers = job.headers
    task_id = headers["id"]
    task = app.tasks[headers["task"]]  # the main process dead-letters unknown names
    started = time.monotonic()
    try:
        accept = serialization.accepted_content_types(app.settings.accept_content)
        args, kwargs, _embed = decode_body(
            serialization.loads(job.body, job.content_type, accept)
        )
    except DecodeError as exc:
        logger.error("Task %s[%s] dead-lettered: %s", task.name, task_id, exc)
        return Outcome("dead_letter", reason=str(exc))

    limits = headers.get("timelimit") or (None, None)
    request = Request(
        id=task_id, task=task.name, args=args, kwargs=kwargs,
        retries=int(headers.get("retries") or 0), eta=headers.get("eta"),
        expires=headers.get("expires"), root_id=headers.get("root_id"),
        parent_id=headers.get("parent_id"), group=headers.get("group"), hostname=job.hostname,
        delivery_info={"queue": job.queue, "delivery_count": job.delivery_count},
        headers=headers, timelimit=(limits[0], limits[1]), called_directly=False,
    )
    backend = None if task.ignore_result or headers.get("ignore_result") else app.backend
    track = task.options.track_started
    if backend is not None and (app.settings.task_track_started if track is None else track):
        backend.store(task_id, states.STARTED, {"pid": os.getpid(), "hostname": job.hostname},
                      retries=request.retries)
    if app.hooks:
        app.hooks.call("before_task", request)

    state, retval, outcome = _run(task, request, args, kwargs)
    runtime = time.monotonic() - started
    if backend is not None and state is not None:
        tb = (traceback.format_exception(retval) if isinstance(retval, BaseException) else None)
        backend.store(task_id, state, retval, traceback="".join(tb) if tb else None,
                      retries=request.retries)
    if app.hooks:
        app.hooks.call("after_task", request, state, retval)
    _log(task.name, task_id, state, retval, runtime)
    return Outcome(outcome.action, state, outcome.reason, runtime)


_ACK = Outcome("ack")


def _run(task: Any, request: Request, args: Any, kwargs: Any
         ) -> tuple[str | None, Any, Outcome]:
    """Run the task; returns (state to store or None, value or exception, outcome)."""
    try:
        return states.SUCCESS, task.run_with(request, args, kwargs), _ACK
    except Retry as r:
        return states.RETRY, r.exc or r, _ACK
    except Ignore:
        return None, None, _ACK
    except Reject as r:
        if r.requeue:
            return None, None, Outcome("requeue")
        return states.FAILURE, r, Outcome("dead_letter", reason=f"rejected: {r.reason}")
    except Exception as exc:
        return states.FAILURE, exc, _ACK


def _log(name: str, task_id: str, state: str | None, retval: Any, runtime: float) -> None:
    if state == states.SUCCESS:
        logger.info("Task %s[%s] succeeded in %.4fs: %.200r", name, task_id, runtime, retval)
    elif state == states.RETRY:
        logger.info("Task %s[%s] retry: %s", name, task_id, retval)
    elif state == states.FAILURE:
        logger.error("Task %s[%s] failed in %.4fs: %s: %s", name, task_id, runtime,
                     type(retval).__name__, retval,
                     exc_info=(type(retval), retval, retval.__traceback__)
                     if logger.isEnabledFor(logging.DEBUG) else None)
