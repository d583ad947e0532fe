"""What a task message asks for after its task ran: the rest of its chain, its callbacks
and its errbacks (protocol v2 ``embed``, Celery's wire format).

Runs where the task ran, before the outcome goes back to the worker's main process, so
the follow-ups are published before the message is acknowledged: a crash in between runs
the task again and publishes them again (at least once). A chain's steps carry the task
ids frozen when the chain was sent, so a repeat is the same task, not a new one.

- ``chain``: signature dicts in reverse order; the last is the next step. It gets the
  result as its first argument (unless immutable) and the rest of the chain.
- ``callbacks`` (``link``): each gets the result as its first argument.
- ``errbacks`` (``link_error``): Celery's two conventions. A task of this worker whose
  function takes ``(request, exc, traceback)`` is called here, at once; any other is sent
  with the failed task's id as its argument.
- ``chord`` (on a header task, with the group id in its ``group`` header): the task's
  result is stored first, then counted in the result backend (``chord_part``: atomic,
  idempotent per task id); the one count that completes the chord sends the body with
  the header's results in member order, or stores ``ChordError`` for it. On a backend
  with ``chords_by_unlock`` (Celery's database layout) the result is only stored: the
  ``celery.chord_unlock`` task the producer sent polls the results and sends the body.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from .. import states
from ..errors import ChordError, DecodeError
from ..producer import SendOptions, build
from ..producer.flow import release_unsent, step
from ..producer.publish import publish_one
from ..protocol import new_id, parse_time
from ..result import AsyncResult, GroupResult
from ..runtime import request as _runtime_request
from .signature import Signature, plain, stamp_headers

if TYPE_CHECKING:
    from ..app import Celeriac
    from ..backends.base import Stored
    from ..protocol import Message
    from ..tasks import Request, Task

# The logger keeps the name it had when this module lived in the worker: users' logging
# configurations name it.
logger = logging.getLogger("celeriac.worker.followups")

SUPPORTED_TYPES = (None, "chain", "group", "chord")


def check_embed(embed: Mapping[str, Any], group_id: Any, *, sizes_stored: bool = False
                ) -> None:
    """Refuse (``DecodeError``) an embed this worker cannot carry out in full: running
    the task alone would half-run the workflow it belongs to. With ``sizes_stored`` (the
    result backend keeps each chord's size, as Celery's Redis layout does) a chord body
    may leave ``chord_size`` out, as Celery's producers do."""
    body = embed.get("chord")
    if body is not None:
        _check_signature("chord", body)
        size = body.get("chord_size")
        if size is None and sizes_stored:
            pass
        elif not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise DecodeError(f"embed 'chord': chord_size must be a positive int, got "
                              f"{size!r}")
        if not isinstance(group_id, str) or not group_id:
            raise DecodeError("embed 'chord' without a group id in the 'group' header")
    for key in ("chain", "callbacks", "errbacks"):
        value = embed.get(key)
        if value is None:
            continue
        if not isinstance(value, list):
            raise DecodeError(f"embed {key!r} must be a list of signatures, got "
                              f"{type(value).__name__}")
        for sig in value:
            _check_signature(key, sig)


def _check_signature(where: str, sig: Any) -> None:
    if not isinstance(sig, dict) or not isinstance(sig.get("task"), str):
        raise DecodeError(f"embed {where!r} holds {sig!r}, which is not a signature")
    kind = sig.get("subtask_type")
    if kind not in SUPPORTED_TYPES:
        raise DecodeError(f"embed {where!r} holds a {kind} signature, which this worker "
                          "does not support yet; the task was not run")
    if kind in ("chain", "group"):
        members = (sig.get("kwargs") or {}).get("tasks")
        if not isinstance(members, list):
            raise DecodeError(f"embed {where!r}: a {kind} signature without its tasks")
        for member in members:
            _check_signature(where, member)
    elif kind == "chord":
        kwargs = sig.get("kwargs") or {}
        header, body = kwargs.get("header"), kwargs.get("body")
        if not isinstance(body, dict):
            raise DecodeError(f"embed {where!r}: a chord signature without its body")
        _check_signature(where, body)
        if isinstance(header, dict):
            _check_signature(where, header)
        elif isinstance(header, list):
            for member in header:
                _check_signature(where, member)
        else:
            raise DecodeError(f"embed {where!r}: a chord signature without its header")


def on_success(app: Celeriac, request: Request, retval: Any, embed: Mapping[str, Any]
               ) -> None:
    chain = embed.get("chain")
    lineage = _lineage(request)
    sent: list[Any] = []
    if chain:
        rest, step = list(chain[:-1]), chain[-1]
        sent += send(app, step, (retval,), lineage, chain=rest)
    for callback in embed.get("callbacks") or ():
        sent += send(app, callback, (retval,), lineage)
    # Stored with this task's result (``AsyncResult.children``), as Celery does.
    request.children = [*(request.children or ()), *sent]


def on_failure(app: Celeriac, request: Request, exc: BaseException, traceback: str | None,
               embed: Mapping[str, Any]) -> None:
    lineage = _lineage(request)
    # The rest of the chain will never run: its results say so (as Celery marks them),
    # so a caller waiting on the chain's last result is not left waiting forever.
    _fail_steps(app, embed.get("chain") or (), exc, lineage)
    for errback in embed.get("errbacks") or ():
        task = app.tasks.get(errback["task"])
        if task is not None and takes_request(task):
            try:
                task(request, exc, traceback)
            except Exception:
                logger.exception("Task %s[%s]: errback %s failed", request.task, request.id,
                                 errback["task"])
            continue
        send(app, errback, (request.id,), lineage)


def chord_part(app: Celeriac, request: Request, part: Stored, body: Mapping[str, Any]
               ) -> None:
    """Store this header task's result, count it, and if that completed the chord, send
    the body (or store its ``ChordError``)."""
    group_id = request.group
    assert group_id is not None  # check_embed refuses a chord without one
    if app.backend.chords_by_unlock:
        app.backend.store_many([part])  # celery.chord_unlock polls for it
        return
    if app.backend.store_part(part, group_id, _size(body),
                              index=request.headers.get("group_index")):
        logger.info("Task %s[%s] completed chord %s: sending its body %s", request.task,
                    request.id, group_id, body["task"])
        _fire(app, group_id, body, _lineage(request))


def defer_part(app: Celeriac, request: Request, retval: Any, body: Mapping[str, Any],
               additions: Sequence[Signature]) -> None:
    """Send what a header task added to its chord (``Task.add_to_chord``, whose ids are
    among the chord's members already) as a chord of their own, whose body
    (``celery.accumulate``, returning ``retval``) takes the task's id and place: so the
    task's part is counted only once its additions have run, and the chord waits for
    them."""
    stand_in = Signature("celery.accumulate", (retval,), {"index": 1}, app=app,
                         task_id=request.id, chord=dict(body), group_id=request.group,
                         group_index=request.group_index)
    carried = {**plain(stand_in), "chord_size": len(additions)}
    sub_id = new_id()
    results: list[AsyncResult[Any]] = []
    for index, sig in enumerate(additions):
        target = sig["kwargs"]["body"] if sig.get("subtask_type") == "chord" else sig
        target.options.update(chord=carried, group_id=sub_id, group_index=index)
        results.append(AsyncResult(target.options["task_id"], app))
    GroupResult(sub_id, results, app).save()  # before any can finish
    for sig in additions:
        sig.apply_async()


def _fire(app: Celeriac, group_id: str, body: Mapping[str, Any],
          lineage: Mapping[str, Any]) -> None:
    saved = GroupResult.restore(group_id, app=app)
    if saved is None:
        return _fail(app, body, (body.get("options") or {}).get("task_id"), lineage,
                     f"chord {group_id}: its member list is gone (expired?)")
    ids = [r.id for r in saved.results]
    fire_body(app, body, ids, app.backend.get_many(ids), lineage)


def fire_body(app: Celeriac, body: Mapping[str, Any], ids: Sequence[str],
              metas: Mapping[str, Any], lineage: Mapping[str, Any]) -> None:
    """Send a complete chord's body with its header's results (``ids`` in member order,
    ``metas`` their stored results), or store ``ChordError`` for it if one failed."""
    body_id = (body.get("options") or {}).get("task_id")
    for task_id in ids:
        meta = metas.get(task_id)
        if meta is None or meta.state != states.SUCCESS:
            state = meta.state if meta else "no result"
            detail = _exception_text(meta.result) if meta else "its result is gone"
            return _fail(app, body, body_id, lineage,
                         f"Dependency {task_id} raised {state}: {detail}")
    # A fresh claim per publish: if this process dies after sending and before its task
    # is acknowledged, the re-run sends the body again (see chord_part); the copy whose
    # claim comes second is then not run (``claimed``).
    claimed = {**body, "options": {**(body.get("options") or {}), "headers": {
        **((body.get("options") or {}).get("headers") or {}), CLAIM_HEADER: new_id()}}}
    send(app, claimed, ([metas[i].result for i in ids],), lineage)


CLAIM_HEADER = "celeriac_chord_claim"
"""A chord body's header: which publish of the body this message is."""


def claimed(app: Celeriac, task_id: str, claim: str, nesting: int = 0) -> bool:
    """Whether this message of a chord body may run: the first copy to ask claims the
    body's id (its redeliveries keep the claim); a second copy, sent by a re-run of the
    task that completed the chord, is not run. The claim is counted as a chord of one.
    ``nesting``: the message's ``replaced_task_nesting``; a chord body that replaced one
    (``Task.replace``) has that body's id, and a claim of its own."""
    key = f"chord-body:{task_id}:{nesting}" if nesting else f"chord-body:{task_id}"
    return app.backend.chord_part(key, claim, 1)


def fail_body(app: Celeriac, body: Mapping[str, Any], lineage: Mapping[str, Any],
              reason: str) -> None:
    """Store ``ChordError(reason)`` for a chord's body that will never be sent."""
    _fail(app, body, (body.get("options") or {}).get("task_id"), lineage, reason)


def _fail(app: Celeriac, body: Mapping[str, Any], body_id: str | None,
          lineage: Mapping[str, Any], reason: str) -> None:
    logger.error("chord body %s[%s] not run: %s", body["task"], body_id, reason)
    error = ChordError(reason)
    if body_id:
        app.backend.store(body_id, states.FAILURE, error)
        for errback in (body.get("options") or {}).get("link_error") or ():
            task = app.tasks.get(errback["task"])
            if task is not None and takes_request(task):
                # Celery's new-style errback, called here with the body's request.
                try:
                    task(_runtime_request.Request(
                        id=body_id, task=body["task"], args=body.get("args") or (),
                        kwargs=body.get("kwargs") or {}, called_directly=False,
                        root_id=lineage.get("root_id"), parent_id=lineage.get("parent_id")),
                        error, None)
                except Exception:
                    logger.exception("chord body %s[%s]: errback %s failed", body["task"],
                                     body_id, errback["task"])
                continue
            send(app, errback, (body_id,), lineage)
    _fail_steps(app, (body.get("options") or {}).get("chain") or (), error, lineage)


def _fail_steps(app: Celeriac, sigs: Sequence[Mapping[str, Any]], exc: BaseException,
                lineage: Mapping[str, Any]) -> None:
    """Store ``exc`` as the outcome of steps that will not run, and of what they hold,
    in one write (a reader sees all of them failed or none); a chord header task among
    them is then counted, so its chord ends (with ``ChordError``)."""
    parts: list[Stored] = []
    chords: list[tuple[str, str, Mapping[str, Any]]] = []
    pending = list(sigs)
    while pending:  # bounded: a message's embed is finite and acyclic (JSON)
        sig = pending.pop()
        kind = sig.get("subtask_type")
        kwargs = sig.get("kwargs") or {}
        if kind in ("group", "chain"):
            pending.extend(kwargs.get("tasks") or ())
            continue
        if kind == "chord":
            pending.append(kwargs["body"])
            continue
        options = sig.get("options") or {}
        pending.extend(options.get("chain") or ())
        task_id = options.get("task_id")
        if not task_id:
            continue  # never given an id: nobody can be waiting for it
        parts.append(app.backend.encode(task_id, states.FAILURE, exc))
        body, group_id = options.get("chord"), options.get("group_id")
        if body and group_id:
            chords.append((group_id, task_id, body))
    if parts:
        app.backend.store_many(parts)
    # Counted after every result is stored (store_many above): a count that completes a
    # chord reads them all.
    for group_id, task_id, body in chords:
        if app.backend.chord_part(group_id, task_id, _size(body)):
            _fire(app, group_id, body, lineage)


def _size(body: Mapping[str, Any]) -> int:
    """A chord's size from its body; 0 when the result backend keeps it (Celery's)."""
    size = body.get("chord_size")
    return int(size) if size is not None else 0


def _exception_text(data: Any) -> str:
    if isinstance(data, dict) and "exc_type" in data:
        message = data.get("exc_message")
        text = " ".join(map(str, message)) if isinstance(message, list) else str(message)
        return f"{data['exc_type']}({text})"
    return repr(data)


def takes_request(task: Task[Any, Any]) -> bool:
    """Whether an errback task takes Celery's new-style ``(request, exc, traceback)``."""
    try:
        params = list(inspect.signature(task.fn).parameters.values())
    except (TypeError, ValueError):
        return False
    if task.options.bind:
        params = params[1:]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 3


def _lineage(request: Request) -> dict[str, Any]:
    return {"parent_id": request.id, "root_id": request.root_id or request.id}


def send(app: Celeriac, sig: Mapping[str, Any], prefix: Sequence[Any],
         lineage: Mapping[str, Any], chain: list[Any] | None = None) -> list[Any]:
    """Publish ``sig`` with ``prefix`` before its own args (unless immutable); returns
    what was sent as result tuples (``AsyncResult.as_tuple``)."""
    kind = sig.get("subtask_type")
    if kind == "group":
        members = [t for m in sig["kwargs"]["tasks"] for t in send(app, m, prefix, lineage)]
        group_id = (sig.get("options") or {}).get("task_id")
        return [((group_id, None), members)] if group_id else members
    if kind == "chain":
        steps = list(sig["kwargs"]["tasks"])
        # Last step first: this chain's steps run before the rest of the outer chain.
        rest = list(chain or []) + list(reversed(steps[1:]))
        return send(app, steps[0], prefix, lineage, chain=rest)
    if kind == "chord":
        # The header gets the previous result, the body the rest of the chain (Celery's
        # chord.run); the chord keeps the ids it was frozen with.
        workflow = Signature.from_dict(sig, app)
        body_result = workflow.apply_async(tuple(prefix), chain=chain or None, **lineage)
        header = body_result.parent
        return [header.as_tuple()] if header is not None else []
    options = dict(sig.get("options") or {})
    chain = chain or options.pop("chain", None)
    args = list(sig.get("args") or ())
    if not sig.get("immutable"):
        args = [*prefix, *args]
    kwargs = dict(sig.get("kwargs") or {})
    embed = {"callbacks": options.pop("link", None) or None,
             "errbacks": options.pop("link_error", None) or None,
             "chain": chain or None, "chord": options.pop("chord", None)}
    queue, message, delay = _message(app, sig["task"], args, kwargs, embed, options, lineage)
    publish_one(app, queue, message, delay)  # with the hooks: a tracer's context
    return [((message.headers["id"], None), None)]


def _message(app: Celeriac, name: str, args: list[Any], kwargs: dict[str, Any],
             embed: dict[str, Any], options: Mapping[str, Any], lineage: Mapping[str, Any]
             ) -> tuple[str, Message, float | None]:
    """The follow-up's message, built as a producer's (``producer.build``) with a
    worker's policy (``lenient``: a compression it cannot apply is logged)."""
    # flow.step: a unique task's lock taken, or its stand-in sent (producer/flow.py).
    stepped = step(app, name, args, kwargs, _send_options(app, name, options, embed, lineage))
    try:
        message, queue, delay = build(app, *stepped, lenient=True)
    except BaseException:  # unbuilt, so unsent: its lock would keep a delay() out
        release_unsent(app, [(stepped[3].task_id or "", stepped[3].headers)])
        raise
    return queue, message, delay


def _task_compression(app: Celeriac, name: str) -> str | None:
    """The registered task's own ``compression`` option, as ``Task.apply_async`` uses it."""
    task = app.tasks.get(name)
    return task.options.compression if task is not None else None


def _send_options(app: Celeriac, name: str, options: Mapping[str, Any],
                  embed: dict[str, Any], lineage: Mapping[str, Any]) -> SendOptions:
    """A signature's options as they travelled (JSON: times as ISO strings), sent as
    they are: not checked (a producer's checks would refuse what a foreign producer
    wrote), the lineage this task's; the registered task's other options not applied."""
    countdown, eta = options.get("countdown"), options.get("eta")
    if countdown:
        countdown, eta = float(countdown), None
    else:
        countdown = None
        eta = parse_time(eta) if isinstance(eta, str) else (
            eta if isinstance(eta, datetime) else None)
    # Celery's frozen steps name the caller's rpc:// queue; without one, the backend's
    # own (RPCBackend.reply_to: this task's, inherited).
    reply_to = options.get("reply_to")
    expires = options.get("expires")
    if isinstance(expires, str):
        expires = parse_time(expires)
    elif not isinstance(expires, (int, float, datetime, timedelta)):
        expires = None
    return SendOptions(
        countdown=countdown, eta=eta, expires=expires, queue=options.get("queue"),
        routing_key=options.get("routing_key"), priority=options.get("priority"),
        task_id=options.get("task_id"),
        headers={**(options.get("headers") or {}), **stamp_headers(options)} or None,
        serializer=options.get("serializer"),
        compression=options.get("compression") or _task_compression(app, name),
        time_limit=options.get("time_limit"), soft_time_limit=options.get("soft_time_limit"),
        ignore_result=bool(options.get("ignore_result")), parent_id=lineage["parent_id"],
        reply_to=reply_to if isinstance(reply_to, str) else None,
        root_id=lineage["root_id"], group_id=options.get("group_id"),
        group_index=options.get("group_index"), add_to_parent=False,
        embed=embed if any(v is not None for v in embed.values()) else None)
