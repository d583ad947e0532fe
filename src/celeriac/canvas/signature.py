"""``Signature``: one task call as a dict with Celery's keys, and what sends it."""

from __future__ import annotations

import abc
import builtins
import copy
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Self, cast

from ..errors import NotRegistered
from ..producer import SendOptions, prepare, send
from ..protocol import new_id
from ..result import AsyncResult, GroupResult
from ..runtime import state as _state
from ..runtime.request import current_request
from ..runtime.state import SharedTask

if TYPE_CHECKING:
    from ..app import Celeriac
    from ..tasks import Task
    from ..transports.base import Outgoing

Result = AsyncResult[Any] | GroupResult
"""What applying a canvas returns: a group's is a ``GroupResult``."""
KEYS = ("task", "args", "kwargs", "options", "subtask_type", "immutable", "chord_size")
"""A signature dict's keys, as Celery writes them."""
IMMUTABLE_OPTIONS = frozenset({"group_id", "stamped_headers"})
"""Options a call's options never replace in a signature that has them (Celery's)."""


class StampingVisitor(abc.ABC):
    """Celery's stamping API: ``sig.stamp(visitor)`` walks a canvas and calls these; the
    headers each returns are stamped on the signatures below it (as options: the
    ``stamped_headers`` list and one option per stamp) and travel as the message's
    ``stamped_headers`` and ``stamps`` headers. Only ``on_signature`` is required."""

    def on_group_start(self, group: Any, **headers: Any) -> dict[str, Any]:
        return {}

    def on_group_end(self, group: Any, **headers: Any) -> None:
        pass

    def on_chain_start(self, chain: Any, **headers: Any) -> dict[str, Any]:
        return {}

    def on_chain_end(self, chain: Any, **headers: Any) -> None:
        pass

    @abc.abstractmethod
    def on_signature(self, sig: Signature, **headers: Any) -> dict[str, Any]:
        """The stamps for ``sig`` (a task's signature)."""

    def on_chord_header_start(self, sig: Any, **header: Any) -> dict[str, Any]:
        return self.on_group_start(sig.header, **header)

    def on_chord_header_end(self, sig: Any, **header: Any) -> None:
        self.on_group_end(sig.header, **header)

    def on_chord_body(self, sig: Any, **header: Any) -> dict[str, Any]:
        return {}

    def on_callback(self, callback: Signature, **header: Any) -> dict[str, Any]:
        return {}

    def on_errback(self, errback: Signature, **header: Any) -> dict[str, Any]:
        return {}


def merge_stamps(d1: dict[str, Any], d2: Mapping[str, Any] | None,
                 aggregate_duplicates: bool = True) -> None:
    """Merge ``d2`` into ``d1`` (Celery's ``_merge_dictionaries``): dicts recursively,
    lists extended; another duplicate becomes a list of both with
    ``aggregate_duplicates``, else keeps ``d1``'s value (as Celery's code does)."""
    if not d2:
        return
    for key, value in d1.items():
        if key not in d2:
            continue
        if isinstance(value, dict):
            merge_stamps(value, d2[key], aggregate_duplicates)
            continue
        if isinstance(value, (int, float, str)):
            d1[key] = [value] if aggregate_duplicates else value
        if isinstance(d2[key], list) and isinstance(d1[key], list):
            d1[key].extend(d2[key])
        elif aggregate_duplicates:
            d1[key] = [] if d1[key] is None else list(d1[key])
            d1[key].append(d2[key])
    for key, value in d2.items():
        if key not in d1:
            d1[key] = value


def stamp_headers(options: Mapping[str, Any]) -> dict[str, Any]:
    """A signature's stamps as the message headers Celery sends them in:
    ``{"stamped_headers": [names], "stamps": {name: value}}``; ``{}`` when unstamped."""
    names = options.get("stamped_headers")
    if not names:
        return {}
    names = [names] if isinstance(names, str) else list(names)
    return {"stamped_headers": names, "stamps": {n: options.get(n) for n in names}}


def pop_stamps(options: dict[str, Any]) -> None:
    """Move a send's stamps from its options into its ``headers`` option (where the
    producer puts every extra header), as Celery's ``send_task`` takes them out."""
    found = stamp_headers(options)
    options.pop("stamped_headers", None)
    if not found:
        return
    for name in found["stamped_headers"]:
        options.pop(name, None)
    options["headers"] = {**(options.get("headers") or {}), **found}


class Signature(dict[str, Any]):
    """One task call: name, arguments and ``apply_async`` options, as a dict.

    Arguments given later are prepended (Celery's rule: a chain passes the previous
    result first), so ``add.s(2).delay(3)`` sends ``add(3, 2)``. An immutable signature
    (``add.si(1, 2)``) ignores them.
    """

    TYPES: ClassVar[dict[str, builtins.type[Signature]]] = {}
    """Subclasses by ``subtask_type``: what ``signature(d)`` rebuilds a dict as."""

    def __init__(self, task: str | Task[Any, Any] | SharedTask | Mapping[str, Any],
                 args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
                 options: Mapping[str, Any] | None = None, *,
                 subtask_type: str | None = None, immutable: bool = False,
                 app: Celeriac | None = None, **ex: Any) -> None:
        self._app = app
        self._type: Task[Any, Any] | None = None
        if isinstance(task, Mapping):  # a dict that travelled: normalize what JSON changed
            super().__init__(task)
            self["args"] = tuple(self.get("args") or ())
            self["kwargs"] = dict(self.get("kwargs") or {})
            opts = self["options"] = dict(self.get("options") or {})
            for key in ("link", "link_error"):
                if opts.get(key):
                    opts[key] = [maybe_signature(s, app) for s in _as_list(opts[key])]
            for key in KEYS:
                self.setdefault(key, False if key == "immutable" else None)
            return
        if isinstance(task, str) and task:
            name = task
        elif isinstance(task, SharedTask):
            name = str(task.name)
        elif isinstance(getattr(task, "name", None), str) and hasattr(task, "apply_async"):
            # A task, told by what it has (as Celery does): the canvas sits below the task
            # class and never imports it.
            self._type = cast("Task[Any, Any]", task)
            name = self._type.name
            self._app = app or self._type.app
        else:
            raise TypeError(f"a signature needs a task or a task name, got {task!r}")
        super().__init__(task=name, args=tuple(args or ()), kwargs=dict(kwargs or {}),
                         options={**(options or {}), **ex}, subtask_type=subtask_type,
                         immutable=immutable, chord_size=None)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], app: Celeriac | None = None) -> Signature:
        target = cls.TYPES.get(d.get("subtask_type") or "")
        if target is not None and target is not cls:
            return target.from_dict(d, app)
        return cls(d, app=app)

    # -- Celery's dict keys as attributes ----------------------------------------------
    @property
    def task(self) -> str:
        return str(self["task"])

    @property
    def name(self) -> str:
        """The task's name, as ``Task.name`` (Celery's duck typing)."""
        return str(self["task"])

    @property
    def args(self) -> tuple[Any, ...]:
        return tuple(self["args"])

    @args.setter
    def args(self, value: Sequence[Any]) -> None:
        self["args"] = tuple(value)

    @property
    def kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = self["kwargs"]
        return kwargs

    @kwargs.setter
    def kwargs(self, value: Mapping[str, Any]) -> None:
        self["kwargs"] = dict(value)

    @property
    def options(self) -> dict[str, Any]:
        options: dict[str, Any] = self["options"]
        return options

    @options.setter
    def options(self, value: Mapping[str, Any]) -> None:
        self["options"] = dict(value)

    @property
    def subtask_type(self) -> str | None:
        return self.get("subtask_type")

    @property
    def immutable(self) -> bool:
        return bool(self.get("immutable"))

    @immutable.setter
    def immutable(self, value: bool) -> None:
        self["immutable"] = bool(value)

    @property
    def id(self) -> str | None:
        """The task id, once assigned (``freeze``, or ``set(task_id=...)``)."""
        return self.options.get("task_id")

    @property
    def app(self) -> Celeriac:
        return self._app or _state.get_current_app()

    @property
    def type(self) -> Task[Any, Any]:
        """The registered task, in this process's app."""
        if self._type is None:
            try:
                self._type = self.app.tasks[self.task]
            except KeyError:
                raise NotRegistered(self.task) from None
        return self._type

    # -- building ------------------------------------------------------------------------
    def _merge(self, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None,
               options: Mapping[str, Any] | None
               ) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, Any]]:
        """Partial application: args prepended, kwargs and options merged over this
        signature's; an immutable signature keeps its own arguments."""
        if options:
            # Stamps are kept against the call's options (Celery's ``_IMMUTABLE_OPTIONS``
            # and the stamped headers): only a stamp this signature lacks is added.
            stamped = self.options.get("stamped_headers")
            keep = IMMUTABLE_OPTIONS.union(stamped) if stamped else IMMUTABLE_OPTIONS
            opts = {**self.options, **{k: v for k, v in options.items()
                                       if k not in keep or k not in self.options}}
        else:
            opts = dict(self.options)
        if self.immutable:
            return self.args, dict(self.kwargs), opts
        return ((*args, *self.args) if args else self.args,
                {**self.kwargs, **kwargs} if kwargs else dict(self.kwargs), opts)

    def clone(self, args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
              **options: Any) -> Self:
        """A copy, with partial ``args``/``kwargs`` and ``options`` applied."""
        a, k, o = self._merge(args, kwargs, options)
        d = copy.deepcopy({**self, "args": a, "kwargs": k, "options": o})
        new = type(self).from_dict(d, self._app)
        new._type = self._type
        return new  # type: ignore[return-value]  # from_dict of type(self) is one

    partial = clone

    def __deepcopy__(self, memo: dict[int, Any]) -> Self:
        # Copy the data, never the app (nor the task) a signature is bound to.
        new = type(self).from_dict(copy.deepcopy(dict(self), memo), self._app)
        new._type = self._type
        return new  # type: ignore[return-value]

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _rebuild, (dict(self),)  # pickle the dict, not the bound app

    def set(self, immutable: bool | None = None, **options: Any) -> Self:
        """Set ``apply_async`` options (``countdown=``, ``queue=``...); returns self."""
        if immutable is not None:
            self.immutable = immutable
        self.options.update(options)
        return self

    def set_immutable(self, immutable: bool) -> None:
        self.immutable = immutable

    def link(self, callback: Mapping[str, Any]) -> Signature:
        """Call ``callback`` with this task's return value once it succeeds."""
        return self._append_option("link", callback)

    def link_error(self, errback: Mapping[str, Any]) -> Signature:
        """Call ``errback`` if this task fails."""
        return self._append_option("link_error", errback)

    def on_error(self, errback: Mapping[str, Any]) -> Self:
        """``link_error`` that returns this signature, not the errback, so that it
        chains: ``add.s(2, 2).on_error(log_error.s()).delay()`` sends ``add``."""
        self.link_error(errback)
        return self

    # -- stamping (Celery 5.3+) ---------------------------------------------------------
    def _stamp_headers(self, visitor_headers: dict[str, Any] | None = None,
                       append_stamps: bool = False, self_headers: bool = True,
                       **headers: Any) -> dict[str, Any]:
        """The stamps from the visitor, ``headers`` and (``self_headers``) this
        signature's own, merged, with their names in ``stamped_headers`` (Celery's)."""
        headers = dict(headers)
        headers.setdefault("stamped_headers", list(headers))
        if visitor_headers is not None:
            visitor_headers = dict(visitor_headers)
            visitor_headers.setdefault("stamped_headers", list(visitor_headers))
            merge_stamps(headers, visitor_headers, aggregate_duplicates=append_stamps)
            headers["stamped_headers"] = _unique(headers["stamped_headers"])
        if self_headers:
            names = _unique([*headers.get("stamped_headers", ()),
                             *_as_list(self.options.get("stamped_headers"))])
            headers["stamped_headers"] = names
            own = {k: v for k, v in self.options.items() if k in names}
            merge_stamps(headers, own, aggregate_duplicates=append_stamps)
            headers["stamped_headers"] = _unique(headers["stamped_headers"])
        return headers

    def stamp(self, visitor: StampingVisitor | None = None, append_stamps: bool = False,
              **headers: Any) -> Self:
        """Stamp this signature (and its callbacks and errbacks) with ``headers`` and
        what ``visitor.on_signature`` returns; ``append_stamps`` keeps both values of a
        stamp given twice, as a list. The stamps travel as the message's
        ``stamped_headers`` and ``stamps`` headers (``request.stamps``)."""
        self.stamp_links(visitor, append_stamps, **headers)
        visitor_headers = None
        if visitor is not None:
            visitor_headers = visitor.on_signature(self, **headers) or {}
        return self.set(**self._stamp_headers(visitor_headers, append_stamps, **headers))

    def stamp_links(self, visitor: StampingVisitor | None, append_stamps: bool = False,
                    **headers: Any) -> None:
        """Stamp this signature's callbacks (``on_callback``) and errbacks
        (``on_errback``), not with this signature's own stamps."""
        for key, hook in (("link", "on_callback"), ("link_error", "on_errback")):
            found = self.options.get(key)
            if not found:
                continue
            links = [maybe_signature(s, self._app) for s in _as_list(found)]
            self.options[key] = links
            stamps = copy.deepcopy(headers)
            for link in links:
                visitor_headers = None
                if visitor is not None:
                    visitor_headers = getattr(visitor, hook)(link, **stamps) or {}
                stamps = self._stamp_headers(visitor_headers, append_stamps, False, **stamps)
                link.stamp(visitor, append_stamps, **stamps)

    def _append_option(self, key: str, value: Mapping[str, Any]) -> Signature:
        sig = maybe_signature(value, self._app)
        items = self.options.get(key)
        items = self.options[key] = _as_list(items)
        if sig not in items:
            items.append(sig)
        return sig

    def freeze(self, task_id: str | None = None, *, group_id: str | None = None,
               group_index: int | None = None, root_id: str | None = None,
               parent_id: str | None = None) -> AsyncResult[Any]:
        """Assign the task id now (kept if already set) and return its result."""
        opts = self.options
        tid = opts.get("task_id") or task_id or new_id()
        opts["task_id"] = tid
        if root_id:
            opts["root_id"] = root_id
        if parent_id:
            opts["parent_id"] = parent_id
        if group_id and "group_id" not in opts:
            opts["group_id"] = group_id
        if group_index is not None:
            opts["group_index"] = group_index
        if "reply_to" not in opts:
            reply_to = reply_queue(self.app)
            if reply_to is not None:
                opts["reply_to"] = reply_to
        return AsyncResult(tid, self.app, self.task)

    def __or__(self, other: Any) -> Any:
        # ``|`` chains (Celery's canvas), where a dict's would merge. The workflow classes
        # come from TYPES (workflows.py fills it when the package loads): they subclass
        # this one, so this module cannot import them.
        chain, group, chord = (cast(Any, self.TYPES[kind]) for kind in ("chain", "group",
                                                                         "chord"))
        if isinstance(self, group) and isinstance(other, Signature) and not isinstance(
                other, (group, chain)):
            return chord(self, other.clone(), app=self._app or other._app)
        if not isinstance(other, Signature):
            return NotImplemented
        # A chain's own links go with its steps (``unchain_tasks``), as Celery's.
        steps = [*(self.unchain_tasks() if isinstance(self, chain) else [self.clone()]),
                 *(other.unchain_tasks() if isinstance(other, chain) else [other.clone()])]
        return chain(*steps, app=self._app or other._app)

    def __ior__(self, other: Any) -> Any:
        return self.__or__(other)

    def _unrolled(self) -> Signature:
        """What this stands for as a step of a chain or a member of a group: itself
        (``chunks``, defined above this package, is its group)."""
        return self

    def __repr__(self) -> str:
        parts = [*map(repr, self.args), *(f"{k}={v!r}" for k, v in self.kwargs.items())]
        return f"{'%' if self.immutable else ''}{self.task}({', '.join(parts)})"

    # -- running -------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the task here, as a plain function call."""
        a, k, _ = self._merge(args, kwargs, None)
        return self.type(*a, **k)

    def delay(self, *args: Any, **kwargs: Any) -> AsyncResult[Any]:
        return self.apply_async(args, kwargs)

    def apply_async(self, args: Sequence[Any] | None = None,
                    kwargs: Mapping[str, Any] | None = None, **options: Any
                    ) -> AsyncResult[Any]:
        """Send the task: partial args prepended, options merged over the signature's
        (``task_always_eager``: run it here). Returns its ``AsyncResult``."""
        options = {k: v for k, v in options.items() if v is not None}  # Celery drops Nones
        if self.app.settings.task_always_eager:
            return self.apply(args, kwargs, **options)
        a, k, o = self._merge(args, kwargs, options)
        return send(self.app, self.task, a, k, self._send_options(o))

    def _send_options(self, options: dict[str, Any], *, publish: bool = True
                      ) -> SendOptions:
        """The merged options of a send as ``SendOptions`` (made once, checked): the
        registered task's own under them, the canvas ones as the embed."""
        o = _with_task_defaults(self.app, self.task, options)
        if not publish:  # the caller publishes (in bulk) with its own retry policy
            o.pop("retry", None)
            o.pop("retry_policy", None)
        embed = _pop_embed(o)
        pop_stamps(o)
        return SendOptions.from_mapping("apply_async", o, embed)

    def _outgoing(self, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None,
                  options: Mapping[str, Any]) -> tuple[Outgoing, Result]:
        """The message ``apply_async`` would publish and its result, unpublished (a
        group publishes its members' in bulk). Retry options are the caller's to use."""
        a, k, o = self._merge(args, kwargs, options)
        item = prepare(self.app, self.task, a, k, self._send_options(o, publish=False))
        return item, AsyncResult(item.message.headers["id"], self.app, self.task)

    def apply(self, args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
              **options: Any) -> AsyncResult[Any]:
        """Run the task here and now (eager); ``link`` callbacks run after a success.
        Errbacks are not run eagerly."""
        a, k, o = self._merge(args, kwargs, {k: v for k, v in options.items()
                                             if v is not None})
        result = self.type.apply(a, k, task_id=o.get("task_id"))
        if o.get("link") and result.successful():
            value = result.get()
            for callback in _as_list(o["link"]):
                maybe_signature(callback, self.app).apply((value,))
        return result


def _rebuild(d: dict[str, Any]) -> Signature:
    return Signature.from_dict(d)


def _unique(names: Any) -> list[Any]:
    return list(dict.fromkeys(_as_list(names)))


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, list):
        return value
    if isinstance(value, tuple):
        return list(value)
    return [value]  # one signature (a dict) given where Celery allows a list


def signature(varies: str | Task[Any, Any] | SharedTask | Mapping[str, Any],
              args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
              *, app: Celeriac | None = None, **options: Any) -> Signature:
    """A signature: a copy of one, one rebuilt from a dict (as it travelled in a
    message: chains and groups rebuild as their own types, by ``subtask_type``), or a
    new one from a task or task name."""
    if isinstance(varies, Signature):
        sig = varies.clone()
        sig._app = app or varies._app
        return sig
    if isinstance(varies, Mapping):
        return Signature.from_dict(varies, app)
    return Signature(varies, args, kwargs, app=app, **options)


def maybe_signature(d: Mapping[str, Any], app: Celeriac | None = None) -> Signature:
    """``d`` itself if it is a signature (bound to ``app`` if given), else rebuilt."""
    if isinstance(d, Signature):
        if app is not None:
            d._app = app
        return d
    if isinstance(d, Mapping):
        return Signature.from_dict(d, app)
    raise TypeError(f"expected a signature or a signature dict, got {d!r}")


def plain(value: Any) -> Any:
    """``value`` with signatures (and tuples) made plain dicts (and lists): what goes in
    an embed, the same under every serializer (pickle would keep the class)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def _with_task_defaults(app: Celeriac, name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The registered task's own options under the call's, as ``Task.apply_async``."""
    task = app.tasks.get(name)
    if task is None:
        return options
    o = task.options
    for key, value in (("queue", o.queue), ("priority", o.priority), ("expires", o.expires),
                       ("serializer", o.serializer), ("compression", o.compression),
                       ("time_limit", o.time_limit),
                       ("soft_time_limit", o.soft_time_limit)):
        if options.get(key) is None and value is not None:
            options[key] = value
    options.setdefault("ignore_result", task.ignore_result)
    return options


def _pop_embed(options: dict[str, Any]) -> dict[str, Any]:
    """Take the canvas options out of ``options``: the message body's embed."""
    chord_body = options.pop("chord", None)
    embed: dict[str, Any] = {}
    for option, key in (("link", "callbacks"), ("link_error", "errbacks"), ("chain", "chain")):
        found = _as_list(options.pop(option, None))
        if found:
            embed[key] = plain(found)
    if chord_body is not None:
        embed["chord"] = plain(chord_body)
    return embed


def reply_queue(app: Celeriac) -> str | None:
    """Where rpc:// replies to a task frozen now go (None: not on rpc://), as Celery's
    ``freeze`` sets ``reply_to``: a chain's steps carry it, so whichever worker, Celery's
    or ours, sends a later step sends it with the caller's queue, and the last one's
    result reaches the caller. Declares the caller's queue on first use (before any step
    is sent, so no reply finds it missing)."""
    backend_url = app.settings.result_backend
    if backend_url is None or backend_url[:3] != "rpc":
        return None
    reply_to = getattr(app.backend, "reply_to", None)
    return reply_to if isinstance(reply_to, str) else None


def root_of(options: Mapping[str, Any], first_id: str) -> str:
    """The root id a workflow's first message gets (as ``send_task`` computes it)."""
    if options.get("root_id"):
        return str(options["root_id"])
    current = current_request() if options.get("add_to_parent", True) else None
    if current is not None:
        return current.root_id or current.id
    return first_id
