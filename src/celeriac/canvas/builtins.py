"""Celery's built-in canvas tasks, ``celery.map``, ``celery.starmap`` and
``celery.chord_unlock`` (and ours, ``celeriac.unique_wait``: a unique workflow step's
stand-in), and the signatures that send the first two:
``task.map(items)``, ``task.starmap(items)``, ``chunks(task, items, n)``.

The tasks keep Celery's names so that the wire matches: a Celery client's
``add.map(...)`` message runs on a celeriac worker, and ours on Celery's. Every app
registers them when it is made (``register_builtins``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import states
from ..errors import Ignore, MaxRetriesExceededError
from ..producer import flow as _flow
from ..result import AsyncResult, GroupResult, tuple_id
from . import followups
from .signature import Signature, maybe_signature, signature
from .workflows import chord, group

if TYPE_CHECKING:
    from ..app import Celeriac
    from ..runtime.request import Request
    from ..runtime.state import SharedTask
    from ..tasks import Task


def register_builtins(app: Celeriac) -> None:
    """Register ``celery.map``, ``celery.starmap``, ``celery.accumulate``,
    ``celery.chord_unlock`` and ``celery.chord`` on ``app``.
    The first two get the member task as a signature dict and call it once per item,
    here, in the one worker task (Celery's: the member's own partial arguments and
    options are not used)."""

    def xmap(task: dict[str, Any], it: list[Any]) -> list[Any]:
        fn = signature(task, app=app).type
        return [fn(item) for item in it]

    def xstarmap(task: dict[str, Any], it: list[Any]) -> list[Any]:
        fn = signature(task, app=app).type
        return [fn(*item) for item in it]

    app._register(xmap, {"name": "celery.map"})
    app._register(xstarmap, {"name": "celery.starmap"})
    app._register(_accumulate, {"name": "celery.accumulate"})
    app._register(_unlock_chord(app), {"name": "celery.chord_unlock", "bind": True,
                                       "max_retries": None, "ignore_result": True})
    app._register(_apply_chord(app), {"name": "celery.chord"})
    app._register(_unique_wait(app), {"name": _flow.WAIT_TASK, "bind": True,
                                      "max_retries": None})


def _apply_chord(app: Celeriac) -> Callable[..., Any]:
    """Celery's ``celery.chord``: a chord sent as a task by name (``header`` a group's
    dict or a list of signature dicts, ``body`` a signature dict) is applied here, its
    header given ``partial_args``; returns the body's id. The chord's own options
    (``kwargs``, as Celery's ``chord.run`` takes them) go to the chord."""

    def apply_chord(header: Any, body: dict[str, Any], partial_args: Sequence[Any] = (),
                    interval: float | None = None, countdown: float = 1,
                    max_retries: int | None = None, eager: bool = False,
                    **kwargs: Any) -> str:
        tasks = header.get("kwargs", {}).get("tasks", []) \
            if isinstance(header, Mapping) and header.get("subtask_type") == "group" \
            else header
        members = group([maybe_signature(s, app) for s in tasks], app=app)
        options = {k: v for k, v in kwargs.items() if k in _CHORD_OPTIONS}
        return chord(members, maybe_signature(body, app), app=app).apply_async(
            tuple(partial_args), **options).id

    return apply_chord


_CHORD_OPTIONS = frozenset({"task_id", "queue", "priority", "root_id", "parent_id",
                            "link", "link_error"})
"""The options ``celery.chord`` passes on to the chord it applies."""


def _accumulate(*args: Any, **kwargs: Any) -> Any:
    """Celery's ``celery.accumulate`` (the body ``Task.replace`` gives a group it is
    replaced with): its ``index``-th argument, else all of them."""
    index = kwargs.get("index")
    return args[index] if index is not None else args


UNLOCK_FIRST_WAIT = 0.01
"""Seconds ``celery.chord_unlock`` waits before its second look, doubling up to
``result_chord_retry_interval`` (when the message gives no ``interval``)."""


def _unlock_chord(app: Celeriac) -> Callable[..., None]:
    """Celery's ``celery.chord_unlock``, for backends with ``chords_by_unlock`` and for
    generator headers: wait (by retrying every ``interval`` seconds) until every header
    task has a final state, then send the body with their results, or store
    ``ChordError`` for it if one failed. Its arguments are Celery's, so a chord a Celery
    client sent is completed by a celeriac worker and the reverse.

    Without an ``interval`` (Celery's default too), the waits start at
    ``UNLOCK_FIRST_WAIT`` and double up to ``result_chord_retry_interval``, where Celery
    waits that long every time: it often comes while the header's last tasks are still
    running, and a chord of 1,000 whose header was done 0.25 s after it was sent then
    waited a whole second more. Seven more looks at most, each a small task."""

    def unlock_chord(self: Task[Any, Any], group_id: str, callback: dict[str, Any],
                     interval: float | None = None, max_retries: int | None = None,
                     result: list[Any] | None = None, **kwargs: Any) -> None:
        request = self.request
        lineage = {"parent_id": request.id, "root_id": request.root_id or request.id}
        ids = [tuple_id(node) for node in result or ()]
        metas = app.backend.get_many(ids)
        if not all(metas.get(i) is not None and metas[i].state in states.READY_STATES
                   for i in ids):
            wait = interval if interval is not None else min(
                app.settings.result_chord_retry_interval,
                UNLOCK_FIRST_WAIT * 2 ** request.retries)
            try:
                raise self.retry(countdown=wait, max_retries=max_retries)
            except MaxRetriesExceededError as exc:
                followups.fail_body(app, callback, lineage,
                                    f"chord {group_id}: chord_unlock gave up: {exc}")
                raise
        followups.fire_body(app, callback, ids, metas, lineage)

    return unlock_chord


def _unique_wait(app: Celeriac) -> Callable[..., Any]:
    """The stand-in of a workflow step whose unique lock another job holds
    (``producer/flow.py``, ``step``): it has the step's id and what follows the step,
    waits for ``holder`` by retrying, then ends with its value or raises its exception;
    if the holder is gone without a result, it sends the step itself (checked again)
    and ends with ``Ignore`` (the step's own job stores its result)."""

    def unique_wait(self: Task[Any, Any], holder: str, lock: str, task: str,
                    args: list[Any], kwargs: dict[str, Any],
                    headers: dict[str, Any] | None = None) -> Any:
        request = self.request
        where = _flow.awaited(app, holder, lock, request.id)
        if where == "wait":
            raise self.retry(countdown=app.settings.result_chord_retry_interval)
        if where == "done":
            return AsyncResult(holder, app).maybe_throw()
        if where == "gone":
            followups.send(app, _step(request, task, args, kwargs, headers), (),
                           {"parent_id": request.parent_id,
                            "root_id": request.root_id or request.id})
        raise Ignore(f"step {request.id} sent as {task}")

    return unique_wait


def _step(request: Request, task: str, args: list[Any], kwargs: dict[str, Any],
          headers: dict[str, Any] | None) -> dict[str, Any]:
    """The step a stand-in stands for, as a signature dict with the stand-in's id,
    place and what follows it."""
    info = request.delivery_info
    options = {"task_id": request.id, "queue": info.get("queue"),
               "priority": info.get("priority"), "headers": headers,
               "group_id": request.group, "group_index": request.group_index,
               "time_limit": request.timelimit[0], "soft_time_limit": request.timelimit[1],
               "expires": request.expires, "reply_to": request.properties.get("reply_to"),
               "ignore_result": request.headers.get("ignore_result"),
               "chain": request.chain, "link": request.callbacks,
               "link_error": request.errbacks, "chord": request.chord}
    return {"task": task, "args": args, "kwargs": kwargs, "immutable": True,
            "options": {k: v for k, v in options.items() if v is not None}}


def _member(task: Task[Any, Any] | SharedTask | Mapping[str, Any], app: Celeriac | None
            ) -> Signature:
    # A task, a shared_task proxy (it has the task's methods), or a signature (dict).
    return maybe_signature(task, app) if isinstance(task, Mapping) else task.s()


class _basemap(Signature):
    """One ``celery.map``/``celery.starmap`` call: ``{"task": <signature>, "it": [...]}``
    as kwargs, immutable (Celery's: its dict has no ``subtask_type``)."""

    task_name = ""

    def __init__(self, task: Task[Any, Any] | SharedTask | Mapping[str, Any],
                 it: Iterable[Any], *,
                 app: Celeriac | None = None, **options: Any) -> None:
        member = _member(task, app)
        super().__init__(self.task_name, (), {"task": member, "it": list(it)}, options,
                         immutable=True, app=app or member._app)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], app: Celeriac | None = None) -> Signature:
        kwargs = d.get("kwargs") or {}
        return cls(kwargs["task"], kwargs.get("it") or (), app=app, **(d.get("options") or {}))

    def apply_async(self, args: Sequence[Any] | None = None,
                    kwargs: Mapping[str, Any] | None = None, **options: Any) -> Any:
        # Routed as the member task would be (Celery's route_name): the queue whose
        # workers have that task.
        if options.get("queue") is None and self.options.get("queue") is None:
            name = self.kwargs["task"]["task"]
            own = self.app.tasks.get(name)
            options["queue"] = (own.options.queue if own else None) or self.app.route(name)
        return super().apply_async(args, kwargs, **options)


class xmap(_basemap):
    """``task.map(items)``: ``[task(item) for item in items]`` in one worker task."""

    task_name = "celery.map"


class xstarmap(_basemap):
    """``task.starmap(items)``: ``[task(*item) for item in items]`` in one worker task."""

    task_name = "celery.starmap"


class chunks(Signature):
    """``chunks(task, items, n)``: the items split into ``n``-sized parts, one
    ``celery.starmap`` task per part, sent as a group (Celery's)."""

    def __init__(self, task: Task[Any, Any] | SharedTask | Mapping[str, Any],
                 it: Iterable[Any], n: int, *, app: Celeriac | None = None, **options: Any) -> None:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"chunks: n must be an int >= 1, got {n!r}")
        member = _member(task, app)
        super().__init__("celery.chunks", (), {"task": member, "it": list(it), "n": n},
                         options, immutable=True, app=app or member._app)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], app: Celeriac | None = None) -> Signature:
        kwargs = d.get("kwargs") or {}
        return cls(kwargs["task"], kwargs.get("it") or (), kwargs["n"], app=app,
                   **(d.get("options") or {}))

    def group(self) -> group:
        task, it, n = self.kwargs["task"], self.kwargs["it"], self.kwargs["n"]
        return group([xstarmap(task, it[i:i + n], app=self._app)
                      for i in range(0, len(it), n)], app=self._app, **self.options)

    def _unrolled(self) -> Signature:
        return self.group()

    def __call__(self, *args: Any, **options: Any) -> GroupResult:
        return self.apply_async(**options)

    def apply_async(self, args: Sequence[Any] | None = None,  # type: ignore[override]
                    kwargs: Mapping[str, Any] | None = None, **options: Any) -> GroupResult:
        return self.group().apply_async(args, kwargs, **options)

    def apply(self, args: Sequence[Any] | None = None,  # type: ignore[override]
              kwargs: Mapping[str, Any] | None = None, **options: Any) -> GroupResult:
        return self.group().apply(args, kwargs, **options)
