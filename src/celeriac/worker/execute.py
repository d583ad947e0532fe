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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .. import serialization, states
from ..backends.base import Stored
from ..canvas import followups
from ..errors import DecodeError, Ignore, Reject, Retry, TimeLimitExceeded
from ..protocol import Delivery, decode_body
from ..result import AsyncResult, GroupResult
from ..runtime.aio import run_sync
from ..runtime.request import Request, short_repr
from ..serialization import compression, signing

if TYPE_CHECKING:
    import asyncio

    from ..app import Celeriac
    from ..backends.base import ResultBackend
    from ..runtime.aio import Guard
    from ..tasks import Task

logger = logging.getLogger("celeriac.worker.execute")

Action = Literal["ack", "requeue", "dead_letter"]
Shown = tuple[str, str | None]
"""What task events show of an outcome: the result's repr, or the exception's repr and
its traceback."""

RESULT_REPR = 256
"""Characters of a result's repr in a task-succeeded event."""
EXCEPTION_REPR = 1024


@dataclass(frozen=True, slots=True)
class Job:
    """A message as the pool receives it: the body is still undecoded bytes. What goes
    in at every boundary of the execution seam (the consumer's ``submit``, the pipes' JOB
    frame, ``execute``)."""

    seq: int
    """This worker's number for the job (not the task id, which is ``headers["id"]``)."""
    headers: dict[str, Any]
    body: bytes
    content_type: str
    queue: str
    delivery_count: int
    hostname: str
    properties: dict[str, Any] | None = None
    """The message's properties (``priority``, ``app_id``...): the request's
    ``properties`` and ``delivery_info["priority"]``."""
    settle: tuple[str, ...] | None = None
    """Set on an idle worker: what a pool child needs to store the result and
    acknowledge the message itself, in one broker call, before it reports
    (``Transport.direct_settle``); the report then says so (``Outcome.settled``)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the main process does with the message after the task ran. What comes out at
    every boundary of the execution seam (``execute``, the pipes' DONE frame, the pool's
    ``on_job_done``)."""

    action: Action
    state: str | None = None
    reason: str | None = None
    runtime: float = 0.0
    stored: Stored | None = None
    """The result to store before the message is settled; None: nothing to store."""
    shown: Shown | None = None
    """For task events (only when they are on): the result's or the exception's repr."""
    settled: bool = False
    """The process that ran it stored the result and acknowledged the message already
    (``Job.settle``): the main process has nothing left to send to the broker."""


Ran = tuple[str | None, Any, Action, str | None]
"""What running the task came to: (state to store or None, value or exception, action,
reason)."""


@dataclass(slots=True)
class _Call:
    """What ``_begin`` prepared and ``_end`` finishes."""

    task: Task[Any, Any]
    request: Request
    job: Job
    embed: dict[str, Any] | None
    """What the message asks for after the task (None: nothing)."""
    backend: ResultBackend | None
    """Where its result goes; None: nowhere (``ignore_result``)."""
    scope: tuple[Any, Any] | None
    """The request made current (``Task.enter``), when hooks or handlers need it."""
    started: float


def execute(app: Celeriac, job: Job, task_events: bool = False,
            loop: asyncio.AbstractEventLoop | None = None) -> Outcome:
    """Run ``job`` here, in a thread (the solo and threads pools, a prefork child in sync
    mode). An ``async def`` task's coroutine runs on ``loop`` (not running: this thread's
    own, kept from task to task so that what a task leaves on it, a client's connection
    pool say, stays usable), else on a fresh loop. With ``task_events``, the outcome also
    carries what the events show (``Shown``), made here, beside the task, rather than in
    the worker's main process."""
    call = _begin(app, job)
    if isinstance(call, Outcome):
        return call
    if not call.task.is_async:
        return _end(app, call, _run(call), task_events)
    coro = _arun(call, None)
    return _end(app, call, run_sync(coro) if loop is None else loop.run_until_complete(coro),
                task_events)


async def aexecute(app: Celeriac, job: Job, task_events: bool = False,
                   guard: Guard | None = None) -> Outcome:
    """``execute`` for an ``async def`` task, awaited in its own asyncio task (its context
    variables are its own). ``guard``: its time limits; once the hard one has fired the
    task fails with ``TimeLimitExceeded`` whatever it did after. Decoding, hooks,
    follow-ups and the result's encoding run on the loop as they do in a thread: short,
    and in the same order as for a sync task."""
    call = _begin(app, job)
    if isinstance(call, Outcome):
        return call
    return _end(app, call, await _arun(call, guard), task_events)


def is_async(app: Celeriac, headers: dict[str, Any]) -> bool:
    """Whether the job's task is an ``async def`` task of this app."""
    task = app.tasks.get(headers["task"])
    return task is not None and task.is_async


def _begin(app: Celeriac, job: Job) -> _Call | Outcome:
    """Decode the body, claim a chord body, build the request, store STARTED, run the
    ``before_task`` hooks; an ``Outcome`` when the task must not run."""
    headers = job.headers
    task = app.tasks[headers["task"]]  # the main process dead-letters unknown names
    started = time.monotonic()
    decoded = _decode(app, task, job)
    if isinstance(decoded, Outcome):
        return decoded
    claim = headers.get(followups.CLAIM_HEADER)
    if isinstance(claim, str):
        nesting = headers.get("replaced_task_nesting")
        refused = _claim(app, task, headers["id"], claim,
                         nesting if type(nesting) is int else 0)
        if refused is not None:
            return refused
    args, kwargs, embed = decoded
    request = _request(task, job, args, kwargs, embed)
    backend = None if task.ignore_result or headers.get("ignore_result") else app.backend
    if backend is not None:
        track = task.options.track_started
        if app.settings.task_track_started if track is None else track:
            backend.store(request.id, states.STARTED,
                          {"pid": os.getpid(), "hostname": job.hostname},
                          retries=request.retries, properties=job.properties)
    hooks = app.hooks
    # Hooks, signal receivers and handlers see the task's request as current (Celery's
    # handlers read self.request); paid only when there are some.
    scope = task.enter(request) if hooks or task.has_handlers else None
    if hooks:
        hooks.call("before_task", request)
    return _Call(task, request, job, embed, backend, scope, started)


def _decode(app: Celeriac, task: Task[Any, Any], job: Job
            ) -> tuple[Any, Any, dict[str, Any] | None] | Outcome:
    """The body's args, kwargs and embed (None when it asks for nothing after the task);
    a dead-letter ``Outcome`` when the body cannot be decoded."""
    headers = job.headers
    try:
        accept = serialization.accepted_content_types(app.settings.accept_content)
        body = job.body
        packed = headers.get(compression.HEADER)
        if packed is not None:  # its name was checked where the message came in
            body = compression.decompress(body, packed, app.settings.max_message_size)
        if job.content_type == signing.CONTENT_TYPE and \
                signing.checked_at_entry(app.settings.accept_content):
            # Its signature was checked where it entered the main process (Admission):
            # once is enough, and the costly part of a signed message. Over these very
            # bytes, also when compressed: Admission decompressed the same body bytes
            # under the same header and limit, and decompression is a function of them
            # alone, so what is opened here is byte for byte what it verified. (The
            # main process hands the job the broker's bytes as they were; nothing but it
            # writes to the pool's pipe.)
            payload = signing.open_admitted(body)
        else:
            payload = serialization.loads(body, job.content_type, accept)
        args, kwargs, raw_embed = decode_body(payload)
        embed = raw_embed if raw_embed and _asks(raw_embed) else None
        if embed is not None:
            # A chord polled by celery.chord_unlock needs no size in its header tasks.
            followups.check_embed(embed, headers.get("group"), sizes_stored=(
                app.backend.chord_sizes_stored or app.backend.chords_by_unlock))
            if embed.get("chord"):
                _chords_counted(app)
    except DecodeError as exc:
        logger.error("Task %s[%s] dead-lettered: %s", task.name, headers["id"], exc)
        # Its FAILURE is stored too: a caller in get() learns why at once. (The state
        # stays None in the outcome: for events this is a rejection, not a failed run.)
        stored = None
        if not (task.ignore_result or headers.get("ignore_result")):
            stored = app.backend.encode(headers["id"], states.FAILURE, exc,
                                        retries=int(headers.get("retries") or 0),
                                        properties=job.properties)
        return Outcome("dead_letter", None, str(exc), 0.0, stored)
    return args, kwargs, embed


def _chords_counted(app: Celeriac) -> None:
    """``DecodeError`` for a chord header task where the result backend cannot count
    chords (rpc://, from a producer configured otherwise): its part could never be
    counted, so the message would come back and run again until dead-lettered."""
    try:
        app.backend.ensure_chords_allowed()
    except NotImplementedError as exc:
        raise DecodeError(f"embed 'chord': {exc}") from exc


def _claim(app: Celeriac, task: Task[Any, Any], task_id: str, claim: str, nesting: int
           ) -> Outcome | None:
    """Claim a chord body's run (``followups.claimed``); an ``Outcome`` when this copy
    must not run: another ran, or the claim could not be made (it goes back)."""
    try:
        first = followups.claimed(app, task_id, claim, nesting)
    except Exception as exc:
        logger.warning("Task %s[%s]: could not claim the chord body (%s); it goes back",
                       task.name, task_id, exc)
        return Outcome("requeue", None, "could not claim the chord body")
    if not first:
        logger.info("Task %s[%s] not run: another copy of this chord body ran",
                    task.name, task_id)
        return Outcome("ack")
    return None


def _request(task: Task[Any, Any], job: Job, args: Any, kwargs: Any,
             embed: dict[str, Any] | None) -> Request:
    """The task's ``self.request`` for this message (with what its embed asks for after
    it: ``Task.replace`` passes that on to the replacement)."""
    headers = job.headers
    limits = headers.get("timelimit") or (None, None)
    properties = job.properties or {}
    request = Request(
        id=headers["id"], task=task.name, args=args, kwargs=kwargs,
        retries=int(headers.get("retries") or 0), eta=headers.get("eta"),
        expires=headers.get("expires"), root_id=headers.get("root_id"),
        parent_id=headers.get("parent_id"), group=headers.get("group"),
        hostname=job.hostname,
        delivery_info={"queue": job.queue, "delivery_count": job.delivery_count,
                       "priority": properties.get("priority")},
        headers=headers, timelimit=(limits[0], limits[1]), called_directly=False,
        group_index=headers.get("group_index"), properties=properties)
    nesting = headers.get("replaced_task_nesting")
    if type(nesting) is int:  # a custom header: not checked where the message came in
        request.replaced_task_nesting = nesting
    if embed is not None:
        request.callbacks, request.errbacks = embed.get("callbacks"), embed.get("errbacks")
        request.chain, request.chord = embed.get("chain"), embed.get("chord")
    return request


def _end(app: Celeriac, call: _Call, ran: Ran, task_events: bool) -> Outcome:
    """Follow-ups, the result's encoding, handlers and ``after_task`` hooks, the log."""
    state, retval, action, reason = ran
    if isinstance(retval, (AsyncResult, GroupResult)) and \
            app.settings.result_serializer != "pickle":
        # A task that returns a result (of what it sent) stores its tuple form, as
        # Celery's backend does (``prepare_value``): readers rebuild it with
        # ``result_from_tuple``.
        retval = retval.as_tuple()
    task, request, job = call.task, call.request, call.job
    embed, backend = call.embed, call.backend
    task_id = request.id
    runtime = time.monotonic() - call.started
    stored = shown = None
    failed = isinstance(retval, BaseException)
    tb = "".join(traceback.format_exception(retval)) if failed and (
        backend is not None or task_events) else None
    # Follow-ups go first: what they send is stored with the result (``children``).
    followed = embed is None or _follow_up(app, request, state, retval, tb, embed)
    if backend is not None and state is not None:
        extended = {"name": task.name, "args": request.args, "kwargs": request.kwargs,
                    "worker": job.hostname, "queue": job.queue
                    } if app.settings.result_extended else None
        if request.children:
            extended = {**(extended or {}), "children": request.children}
        stored = backend.encode(task_id, state, retval, traceback=tb, retries=request.retries,
                                extended=extended, properties=job.properties)
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
            if request.chord_additions and state == states.SUCCESS:
                # Task.add_to_chord: its part is counted once what it added has run.
                followups.defer_part(app, request, retval, embed["chord"],
                                     request.chord_additions)
            else:
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
    if call.scope is not None:
        task.leave(call.scope)
    _log(job.headers.get("shadow") or task.name, task_id, state, retval, runtime)
    return Outcome(action, state, reason, runtime, stored, shown)


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


def _run(call: _Call) -> Ran:
    """Run the task (the sync edge's middle)."""
    request = call.request
    try:
        value = call.task.run_with(request, request.args, request.kwargs)
    except Exception as exc:
        return _raised(exc)
    return states.SUCCESS, value, "ack", None


async def _arun(call: _Call, guard: Guard | None) -> Ran:
    """``_run`` for an ``async def`` task (the async edge's middle)."""
    request = call.request
    try:
        value = await call.task.arun_with(request, request.args, request.kwargs, guard)
        ran: Ran = (states.SUCCESS, value, "ack", None)
    except Exception as exc:
        ran = _raised(exc)
    if guard is not None and isinstance(guard.fired, TimeLimitExceeded):
        return states.FAILURE, guard.fired, "ack", None
    return ran


def _raised(exc: Exception) -> Ran:
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


def received_request(d: Delivery, hostname: str) -> Request:
    """What the main process knows of a task for hooks: its headers (the arguments are
    decoded only where it runs)."""
    h = d.message.headers
    return Request(id=h["id"], task=h["task"], retries=int(h.get("retries") or 0),
                   eta=h.get("eta"), expires=h.get("expires"), root_id=h.get("root_id"),
                   parent_id=h.get("parent_id"), group=h.get("group"), hostname=hostname,
                   delivery_info={"queue": d.queue, "delivery_count": d.delivery_count},
                   headers=h, called_directly=False)
