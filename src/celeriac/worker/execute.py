"""Running one task message in the process that executes it (solo thread or pool child).

``execute`` decodes the body, runs the task, encodes its result, and returns an
``Outcome`` that tells the worker's main process what to do with the message and what
result to store. The main process stores the results of many tasks at once and only then
acknowledges their messages: a crash in between redelivers a task, never loses its
result. It never raises for anything a task or a message can do; only shutdown requests
propagate.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal

from .. import compression, serialization, states
from .._aio import run_sync
from .._request import Request, short_repr
from ..backends.base import Stored
from ..errors import DecodeError, Ignore, Reject, Retry, TimeLimitExceeded
from ..protocol import decode_body
from . import followups

if TYPE_CHECKING:
    import asyncio

    from .._aio import Guard
    from ..app import Celeriac

logger = logging.getLogger("celeriac.worker.execute")

Action = Literal["ack", "requeue", "dead_letter"]
Shown = tuple[str, str | None]
"""What task events show of an outcome: the result's repr, or the exception's repr and
its traceback."""
Result = tuple[Action, str | None, str | None, float, Stored | None, Shown | None]
"""An ``Outcome``'s fields without the object: (action, state, reason, runtime, stored,
shown)."""

RESULT_REPR = 256
"""Characters of a result's repr in a task-succeeded event."""
EXCEPTION_REPR = 1024


def _slot_setters(cls: type, names: str) -> tuple[Callable[[Any, Any], None], ...]:
    """The setters of ``cls``'s slots, for an ``__init__`` that bypasses the frozen guard.

    A frozen dataclass's generated ``__init__`` assigns each field through
    ``object.__setattr__``, which costs twice what the slot's own setter does, and the
    worker builds a ``Job`` and an ``Outcome`` for every task (0.5 us -> 0.3 us each).
    """
    return tuple(vars(cls)[name].__set__ for name in names.split())


@dataclass(frozen=True, slots=True, init=False)
class Job:
    """A message as the pool receives it: the body is still undecoded bytes."""

    seq: int
    """This worker's number for the job (not the task id, which is ``headers["id"]``)."""
    headers: dict[str, Any]
    body: bytes
    content_type: str
    queue: str
    delivery_count: int
    hostname: str

    def __init__(self, seq: int, headers: dict[str, Any], body: bytes, content_type: str,
                 queue: str, delivery_count: int, hostname: str) -> None:
        set_seq, set_headers, set_body, set_content_type, set_queue, set_count, set_host = (
            _JOB_SETTERS)
        set_seq(self, seq)
        set_headers(self, headers)
        set_body(self, body)
        set_content_type(self, content_type)
        set_queue(self, queue)
        set_count(self, delivery_count)
        set_host(self, hostname)


_JOB_SETTERS = _slot_setters(Job, "seq headers body content_type queue delivery_count hostname")


@dataclass(frozen=True, slots=True, init=False)
class Outcome:
    """What the main process does with the message after the task ran."""

    action: Action
    state: str | None = None
    reason: str | None = None
    runtime: float = 0.0
    stored: Stored | None = None
    """The result to store before the message is settled; None: nothing to store."""
    shown: Shown | None = None
    """For task events (only when they are on): the result's or the exception's repr."""

    def __init__(self, action: Action, state: str | None = None, reason: str | None = None,
                 runtime: float = 0.0, stored: Stored | None = None,
                 shown: Shown | None = None) -> None:
        set_action, set_state, set_reason, set_runtime, set_stored, set_shown = (
            _OUTCOME_SETTERS)
        set_action(self, action)
        set_state(self, state)
        set_reason(self, reason)
        set_runtime(self, runtime)
        set_stored(self, stored)
        set_shown(self, shown)


_OUTCOME_SETTERS = _slot_setters(Outcome, "action state reason runtime stored shown")


def execute(app: Celeriac, job: Job, task_events: bool = False,
            loop: asyncio.AbstractEventLoop | None = None) -> Outcome:
    """Run ``job`` here; an ``async def`` task on ``loop`` (not running: this thread's own,
    kept from task to task so that what a task leaves on it, a client's connection pool
    say, stays usable), else on a fresh loop."""
    if loop is not None and is_async(app, job.headers):
        return Outcome(*loop.run_until_complete(aexecute_message(
            app, job.headers, job.body, job.content_type, job.queue, job.delivery_count,
            job.hostname, task_events)))
    return Outcome(*execute_message(app, job.headers, job.body, job.content_type, job.queue,
                                    job.delivery_count, job.hostname, task_events))


def execute_message(app: Celeriac, headers: dict[str, Any], body: bytes, content_type: str,
                    queue: str, delivery_count: int, hostname: str,
                    task_events: bool = False) -> Result:
    """``execute`` for a caller that holds the job's fields rather than a ``Job``.

    A pool child reads the fields from its pipe and writes them back; building a ``Job``
    and an ``Outcome`` (frozen dataclasses, about 0.5 us each) would only be thrown away.
    With ``task_events``, the result also carries what the events show (``Shown``),
    made here, beside the task, rather than in the worker's main process.
    """
    call = _begin(app, headers, body, content_type, queue, hostname, delivery_count)
    if len(call) != _CALL_LEN:
        return call
    task, request, args, kwargs = call[:4]
    if task.is_async:
        # An executor without a loop of its own: the coroutine runs on a fresh one.
        # (The pools run async tasks on their loops, through aexecute_message.)
        state, retval, action, reason = run_sync(_arun(task, request, args, kwargs, None))
    else:
        state, retval, action, reason = _run(task, request, args, kwargs)
    return _end(app, call, state, retval, action, reason, task_events)


async def aexecute_message(app: Celeriac, headers: dict[str, Any], body: bytes,
                           content_type: str, queue: str, delivery_count: int, hostname: str,
                           task_events: bool = False, guard: Guard | None = None) -> Result:
    """``execute_message`` for an ``async def`` task, awaited in its own asyncio task
    (its context variables are its own). ``guard``: its time limits; once the hard one
    has fired the task fails with ``TimeLimitExceeded`` whatever it did after. Decoding,
    hooks, follow-ups and the result's encoding run on the loop as they do in a thread:
    short, and in the same order as for a sync task."""
    call = _begin(app, headers, body, content_type, queue, hostname, delivery_count)
    if len(call) != _CALL_LEN:
        return call
    task, request, args, kwargs = call[:4]
    state, retval, action, reason = await _arun(task, request, args, kwargs, guard)
    if guard is not None and isinstance(guard.fired, TimeLimitExceeded):
        state, retval, action, reason = states.FAILURE, guard.fired, "ack", None
    return _end(app, call, state, retval, action, reason, task_events)


def is_async(app: Celeriac, headers: dict[str, Any]) -> bool:
    """Whether the job's task is an ``async def`` task of this app."""
    task = app.tasks.get(headers["task"])
    return task is not None and task.is_async


_Call = tuple[Any, ...]
"""What ``_begin`` prepared and ``_end`` finishes: (task, request, args, kwargs, embed,
backend, scope, started, headers, queue, hostname). A plain tuple, told from a ``Result``
(six items) by its length: a class with eleven slots cost 0.6 us more per task."""
_CALL_LEN = 11


def _begin(app: Celeriac, headers: dict[str, Any], body: bytes, content_type: str,
           queue: str, hostname: str, delivery_count: int) -> _Call:
    """Decode the body, claim a chord body, build the request, store STARTED, run the
    ``before_task`` hooks; a ``Result`` when the task must not run."""
    task_id = headers["id"]
    task = app.tasks[headers["task"]]  # the main process dead-letters unknown names
    started = time.monotonic()
    try:
        accept = serialization.accepted_content_types(app.settings.accept_content)
        packed = headers.get(compression.HEADER)
        if packed is not None:  # its name was checked where the message came in
            body = compression.decompress(body, packed, app.settings.max_message_size)
        args, kwargs, raw_embed = decode_body(serialization.loads(body, content_type, accept))
        embed = raw_embed if raw_embed and _asks(raw_embed) else None
        if embed is not None:
            # A chord polled by celery.chord_unlock needs no size in its header tasks.
            followups.check_embed(embed, headers.get("group"), sizes_stored=(
                app.backend.chord_sizes_stored or app.backend.chords_by_unlock))
    except DecodeError as exc:
        logger.error("Task %s[%s] dead-lettered: %s", task.name, task_id, exc)
        # Its FAILURE is stored too: a caller in get() learns why at once. (The state
        # stays None in the outcome: for events this is a rejection, not a failed run.)
        stored = None
        if not (task.ignore_result or headers.get("ignore_result")):
            stored = app.backend.encode(task_id, states.FAILURE, exc,
                                        retries=int(headers.get("retries") or 0))
        return "dead_letter", None, str(exc), 0.0, stored, None

    claim = headers.get(followups.CLAIM_HEADER)
    if isinstance(claim, str):
        try:
            first = followups.claimed(app, task_id, claim)
        except Exception as exc:
            logger.warning("Task %s[%s]: could not claim the chord body (%s); it goes back",
                           task.name, task_id, exc)
            return "requeue", None, "could not claim the chord body", 0.0, None, None
        if not first:
            logger.info("Task %s[%s] not run: another copy of this chord body ran",
                        task.name, task_id)
            return "ack", None, None, 0.0, None, None
    limits = headers.get("timelimit") or (None, None)
    # Positional: with sixteen keyword arguments the call costs 0.4 us more per task.
    # _REQUEST_FIELDS (checked at import) pins the order.
    request = Request(
        task_id, task.name, args, kwargs, int(headers.get("retries") or 0),
        headers.get("eta"), headers.get("expires"), headers.get("root_id"),
        headers.get("parent_id"), headers.get("group"), hostname,
        {"queue": queue, "delivery_count": delivery_count}, headers, (limits[0], limits[1]),
        False, False,
    )
    backend = None if task.ignore_result or headers.get("ignore_result") else app.backend
    if backend is not None:
        track = task.options.track_started
        if app.settings.task_track_started if track is None else track:
            backend.store(task_id, states.STARTED, {"pid": os.getpid(), "hostname": hostname},
                          retries=request.retries)
    hooks = app.hooks
    # Hooks, signal receivers and handlers see the task's request as current (Celery's
    # handlers read self.request); paid only when there are some.
    scope = task.enter(request) if hooks or task.has_handlers else None
    if hooks:
        hooks.call("before_task", request)
    return (task, request, args, kwargs, embed, backend, scope, started, headers, queue,
            hostname)


def _end(app: Celeriac, call: _Call, state: str | None, retval: Any, action: Action,
         reason: str | None, task_events: bool) -> Result:
    """Follow-ups, the result's encoding, handlers and ``after_task`` hooks, the log."""
    task, request, args, kwargs, embed, backend, scope, started, headers, queue, hostname = call
    task_id = request.id
    runtime = time.monotonic() - started
    stored = shown = None
    failed = isinstance(retval, BaseException)
    tb = "".join(traceback.format_exception(retval)) if failed and (
        backend is not None or task_events) else None
    # Follow-ups go first: what they send is stored with the result (``children``).
    followed = embed is None or _follow_up(app, request, state, retval, tb, embed)
    if backend is not None and state is not None:
        extended = {"name": task.name, "args": args, "kwargs": kwargs, "worker": hostname,
                    "queue": queue} if app.settings.result_extended else None
        if request.children:
            extended = {**(extended or {}), "children": request.children}
        stored = backend.encode(task_id, state, retval, traceback=tb, retries=request.retries,
                                extended=extended)
    if task_events and state is not None:
        shown = (exception_repr(retval), tb) if failed else (result_repr(retval), None)
    if not followed:
        # Acknowledging would lose the rest of the workflow: the message goes back and the
        # task runs again (at least once), until task_max_deliveries dead-letters it.
        action, reason = "requeue", "could not send its chain, link or link_error"
        stored = None
    elif embed is not None and embed.get("chord") and state in _CHORD_ENDS:
        # A header task's result must be stored before it is counted: the count that
        # completes the chord reads every header result.
        part = stored or app.backend.encode(task_id, state, retval, traceback=tb,
                                            retries=request.retries)
        try:
            followups.chord_part(app, request, part, embed["chord"])
            stored = None  # stored already
        except Exception:
            logger.exception("Task %s[%s]: could not count its part of chord %s",
                             task.name, task_id, request.group)
            action, reason, stored = "requeue", "could not count its chord part", None
    if task.has_handlers:
        task.call_handlers(request, state, retval)
    hooks = app.hooks
    if hooks:
        hooks.call("after_task", request, state, retval)
    if scope is not None:
        task.leave(scope)
    _log(headers.get("shadow") or task.name, task_id, state, retval, runtime)
    return action, state, reason, runtime, stored, shown


_CHORD_ENDS = (states.SUCCESS, states.FAILURE)


def _asks(embed: dict[str, Any]) -> bool:
    return bool(embed.get("chain") or embed.get("callbacks") or embed.get("errbacks")
                or embed.get("chord"))


def _follow_up(app: Celeriac, request: Request, state: str | None, retval: Any,
               tb: str | None, embed: dict[str, Any]) -> bool:
    """The chain's next step and the callbacks, or the errbacks; False (logged) when they
    could not all be published."""
    try:
        if state == states.SUCCESS:
            followups.on_success(app, request, retval, embed)
        elif state == states.FAILURE and isinstance(retval, BaseException):
            if tb is None:
                tb = "".join(traceback.format_exception(retval))
            followups.on_failure(app, request, retval, tb, embed)
    except Exception:
        logger.exception("Task %s[%s]: could not send what its message asked for after it "
                         "(chain, link or link_error)", request.task, request.id)
        return False
    return True


def result_repr(value: Any) -> str:
    text = short_repr(value)
    return text if len(text) <= RESULT_REPR else text[:RESULT_REPR - 3] + "..."


def exception_repr(exc: BaseException) -> str:
    try:
        text = repr(exc)
    except Exception:  # a broken __repr__ must not lose the event
        text = f"{type(exc).__name__}(<unrepresentable>)"
    return text if len(text) <= EXCEPTION_REPR else text[:EXCEPTION_REPR - 3] + "..."


_REQUEST_FIELDS = ("id", "task", "args", "kwargs", "retries", "eta", "expires", "root_id",
                   "parent_id", "group", "hostname", "delivery_info", "headers", "timelimit",
                   "is_eager", "called_directly", "children")
if tuple(f.name for f in fields(Request)) != _REQUEST_FIELDS:  # pragma: no cover
    raise ImportError("celeriac.tasks.Request changed its fields: update execute_message")


def _run(task: Any, request: Request, args: Any, kwargs: Any
         ) -> tuple[str | None, Any, Action, str | None]:
    """Run the task; returns (state to store or None, value or exception, action, reason)."""
    try:
        return states.SUCCESS, task.run_with(request, args, kwargs), "ack", None
    except Exception as exc:
        return _raised(exc)


async def _arun(task: Any, request: Request, args: Any, kwargs: Any, guard: Guard | None
                ) -> tuple[str | None, Any, Action, str | None]:
    """``_run`` for an ``async def`` task."""
    try:
        return states.SUCCESS, await task.arun_with(request, args, kwargs, guard), "ack", None
    except Exception as exc:
        return _raised(exc)


def _raised(exc: Exception) -> tuple[str | None, Any, Action, str | None]:
    """What a task that raised ``exc`` comes to: Celery's control-flow exceptions first."""
    if isinstance(exc, Retry):
        return states.RETRY, exc.exc or exc, "ack", None
    if isinstance(exc, Ignore):
        return None, None, "ack", None
    if isinstance(exc, Reject):
        if exc.requeue:
            return None, None, "requeue", None
        return states.FAILURE, exc, "dead_letter", f"rejected: {exc.reason}"
    return states.FAILURE, exc, "ack", None


def _log(name: str, task_id: str, state: str | None, retval: Any, runtime: float) -> None:
    if state == states.SUCCESS:
        # reprlib's cut, not %r: a result nested thousands deep would take repr past the
        # recursion limit and the child down with it.
        if logger.isEnabledFor(logging.INFO):
            logger.info("Task %s[%s] succeeded in %.4fs: %s", name, task_id, runtime,
                        short_repr(retval))
    elif state == states.RETRY:
        logger.info("Task %s[%s] retry: %s", name, task_id, retval)
    elif state == states.FAILURE:
        logger.error("Task %s[%s] failed in %.4fs: %s: %s", name, task_id, runtime,
                     type(retval).__name__, retval,
                     exc_info=(type(retval), retval, retval.__traceback__)
                     if logger.isEnabledFor(logging.DEBUG) else None)
