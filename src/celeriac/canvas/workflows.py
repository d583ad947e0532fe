"""``chain``, ``group`` and ``chord``, and how they nest."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

from ..protocol import new_id
from ..result import AsyncResult, GroupResult
from .signature import (
    Result,
    Signature,
    StampingVisitor,
    _as_list,
    maybe_signature,
    plain,
    root_of,
)

if TYPE_CHECKING:
    from ..app import Celeriac
    from ..transports.base import Outgoing

GROUP_CHUNK = 1000
"""Messages per broker round trip when a group is sent (as ``send_many``)."""


def _members(tasks: tuple[Any, ...], app: Celeriac | None) -> list[Signature]:
    # chain(a, b) and chain([a, b]) (and a generator) alike, as Celery.
    if len(tasks) == 1 and not isinstance(tasks[0], Mapping) and not _is_task(tasks[0]):
        tasks = tuple(tasks[0])
    return [_as_signature(t, app) for t in tasks]


def _is_task(value: Any) -> bool:
    """A task or a shared-task proxy, told by what it has (the canvas never imports the
    task class)."""
    return not isinstance(value, Mapping) and isinstance(getattr(value, "name", None), str) \
        and hasattr(value, "apply_async")  # a signature has both too


def _as_signature(value: Any, app: Celeriac | None) -> Signature:
    """A member as a signature: a signature or its dict, or a task (or a shared-task
    proxy) given bare, which stands for its call without arguments (Celery's
    ``signature(task)``)."""
    if not isinstance(value, Mapping) and _is_task(value):
        return Signature(value, app=app)
    return maybe_signature(value, app)


def _app_of(members: list[Signature], app: Celeriac | None) -> Celeriac | None:
    # The members' app, not whichever app is current: a workflow of one app's tasks is
    # sent where they are (as Celery, which takes the first member's).
    return app or next((m._app for m in members if m._app is not None), None)


class chain(Signature):
    """Steps run one after another, each given the previous one's return value
    (unless immutable): ``chain(a, b, c)`` or ``a | b | c``."""

    def __init__(self, *tasks: Any, app: Celeriac | None = None, **options: Any) -> None:
        steps = _members(tasks, app)
        super().__init__("celery.chain", (), {"tasks": steps}, options,
                         subtask_type="chain", app=_app_of(steps, app))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], app: Celeriac | None = None) -> Signature:
        return cls(*(d.get("kwargs") or {}).get("tasks") or (), app=app,
                   **(d.get("options") or {}))

    @property
    def tasks(self) -> list[Signature]:
        tasks: list[Signature] = self.kwargs["tasks"]
        return tasks

    def __repr__(self) -> str:
        return " | ".join(map(repr, self.tasks)) or "chain(<empty>)"

    def unchain_tasks(self) -> list[Signature]:
        """The steps, copied, with the chain's own links (Celery's; what it is spliced into
        another as): its callbacks on the last step, its errbacks on every step."""
        tasks = [t.clone() for t in self.tasks]
        if tasks:
            for callback in _as_list(self.options.get("link")):
                tasks[-1].link(callback)
            for errback in _as_list(self.options.get("link_error")):
                for task in tasks:
                    task.link_error(errback)
        return tasks

    def stamp(self, visitor: StampingVisitor | None = None,  # type: ignore[override]
              append_stamps: bool = False, **headers: Any) -> None:
        """Stamp every step (and the chain's links), as Celery's ``chain.stamp``."""
        visitor_headers = None
        if visitor is not None:
            visitor_headers = visitor.on_chain_start(self, **headers) or {}
        headers = self._stamp_headers(visitor_headers, append_stamps, **headers)
        self.stamp_links(visitor, **headers)
        for task in self.tasks:
            task.stamp(visitor, append_stamps, **headers)
        if visitor is not None:
            visitor.on_chain_end(self, **headers)

    def __call__(self, *args: Any, **kwargs: Any) -> Result:
        return self.apply_async(args, kwargs)

    def _steps(self, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None
               ) -> list[Signature]:
        """The steps, copied, nested chains spliced in, the partial arguments given to
        the first."""
        steps: list[Signature] = []
        pending = [s.clone() for s in self.tasks]
        while pending:
            step = pending.pop(0)
            if isinstance(step, chain):
                pending[:0] = step.unchain_tasks()
            elif isinstance(step, group) and len(step.tasks) == 1:
                # A group of one is its member (Celery's maybe_unroll_group).
                pending.insert(0, step.tasks[0].clone())
            else:
                steps.append(step._unrolled())
        if not steps:
            raise ValueError("cannot apply an empty chain")
        if args or kwargs or self.args:
            steps[0] = steps[0].clone((*(args or ()), *self.args), kwargs)
        # A group followed by a step is a chord whose body is that step (Celery's
        # upgrade): the step waits for all the members and gets the list of results. A
        # group after a group is a chord whose body is the second group (each of its
        # members gets the list), and what follows waits for that one.
        upgraded: list[Signature] = []
        for step in steps:
            joined = _upgrade(upgraded[-1], step, self._app) if upgraded else None
            if joined is not None:
                upgraded[-1] = joined
            else:
                upgraded.append(step)
        return upgraded

    def _freeze_steps(self, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None,
                      options: dict[str, Any]) -> tuple[list[Signature], list[Result]]:
        """Steps with their task ids assigned, and their results, each linked to the
        result before it by ``parent``. Pops the options that belong to one step:
        ``task_id``, ``group_id`` and ``group_index`` name the last step (the one a
        group waits for, as Celery); ``link`` goes to the last, ``link_error`` to all."""
        steps = self._steps(args, kwargs)
        last_id = options.pop("task_id", None)
        group_id, group_index = options.pop("group_id", None), options.pop("group_index", None)
        chord_body = options.pop("chord", None)
        if (group_id is not None or chord_body is not None) and isinstance(steps[-1], group):
            # A chain ending in a group, as a group member or in a chord's header: the
            # group's results, as one list, are the member's (Celery's nested result),
            # collected by a chord of its own whose body passes the list on.
            steps[-1] = chord(steps[-1], Signature("celery.accumulate", kwargs={"index": 0},
                                                   app=self._app), app=self._app)
        links, errbacks = options.pop("link", None), options.pop("link_error", None)
        first = steps[0].freeze(last_id if len(steps) == 1 else None,
                                root_id=options.get("root_id"),
                                parent_id=options.get("parent_id"))
        # The worker sends each next step with parent_id = the step before and root_id =
        # the workflow's root (Celery's trace.py); set here too so the embed is right as
        # it stands.
        root = root_of(options, first.id)
        results: list[Result] = [first]
        for i, step in enumerate(steps[1:], 1):
            last = i == len(steps) - 1
            res = step.freeze(last_id if last else None, root_id=root,
                              parent_id=steps[i - 1].id)
            # A chord's body result already leads to its header: the step before goes
            # above the header.
            top: Any = res
            while top.parent is not None:
                top = top.parent
            top.parent = results[-1]
            results.append(res)
        if group_id is not None or chord_body is not None:
            # A chain in a group or a chord's header: its last step is the member the
            # group waits for and the one counted in the chord (as Celery); a chord there
            # gives that place to its body (chord.apply_async).
            steps[-1].set(group_id=group_id, group_index=group_index)
            if chord_body is not None:
                steps[-1].set(chord=chord_body)
        for callback in _as_list(links):
            steps[-1].link(callback)
        for errback in _as_list(errbacks):
            for step in steps:
                step.link_error(errback)
        return steps, results

    def _outgoing(self, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None,
                  options: Mapping[str, Any]) -> tuple[Outgoing, Result]:
        """The first step's message, carrying the others in its embed, and the last
        step's result."""
        opts = {**self.options, **options}
        steps, results = self._freeze_steps(args, kwargs, opts)
        if isinstance(steps[0], (group, chord)):
            raise ValueError("a chain that starts with a group or a chord is no one "
                             "message: apply it (group and chord members are)")
        # Celery's wire format: remaining steps last-first, the worker pops the next off
        # the end; a chain already in the options (this chain sent as a step) runs after.
        rest = [plain(s) for s in reversed(steps[1:])]
        opts["chain"] = [*_as_list(opts.get("chain")), *rest]
        item, _ = steps[0]._outgoing((), {}, opts)
        return item, results[-1]

    def apply_async(self, args: Sequence[Any] | None = None,  # type: ignore[override]
                    kwargs: Mapping[str, Any] | None = None, **options: Any) -> Result:
        """Send the first step (the others travel in its message); returns the last
        step's result, whose ``parent`` chain leads back to the first."""
        options = {k: v for k, v in options.items() if v is not None}
        if self.app.settings.task_always_eager:
            return self.apply(args, kwargs, **options)
        opts = {**self.options, **options}
        retry, policy = opts.pop("retry", None), opts.pop("retry_policy", None)
        steps = self._steps(None, None)
        member = opts.get("group_id") is not None or opts.get("chord") is not None
        if len(steps) == 1 and isinstance(steps[0], group) and not member:
            return steps[0].apply_async(args, kwargs, retry=retry, retry_policy=policy,
                                        **opts)
        if isinstance(steps[0], (group, chord)):  # a group here is a member's: a chord
            # A chord has no one message to carry the chain: the rest of the chain rides
            # on its body (as Celery), which the header's last task sends.
            frozen, results = self._freeze_steps(args, kwargs, opts)
            rest = [plain(s) for s in reversed(frozen[1:])]
            frozen[0].apply_async(chain=rest or None, retry=retry, retry_policy=policy,
                                  **opts)
            return results[-1]
        item, result = self._outgoing(args, kwargs, opts)
        self.app.publish_prepared([item], retry=retry, retry_policy=policy)
        return result

    def apply(self, args: Sequence[Any] | None = None,  # type: ignore[override]
              kwargs: Mapping[str, Any] | None = None, **options: Any) -> Result:
        """Run every step here, in turn, each given the previous one's value."""
        last: Result | None = None
        for step in self._steps(args, kwargs):
            res = step.apply((last.get(),) if last is not None else None)
            res.parent = last
            last = res
        assert last is not None  # _steps refuses an empty chain
        return last

    def freeze(self, task_id: str | None = None,  # type: ignore[override]
               **options: Any) -> Result:
        """The last step's result; the steps keep their ids when the chain is sent."""
        opts = {**self.options, **{k: v for k, v in options.items() if v is not None}}
        if task_id:
            opts["task_id"] = task_id
        steps, results = self._freeze_steps(None, None, opts)
        self.kwargs["tasks"] = steps
        # The chain's id is its last task's (Celery's: ``c.freeze(); c.id``).
        self.options["task_id"] = results[-1].id
        return results[-1]


class group(Signature):
    """Members run in parallel: ``group(a, b)``, ``group([...])``, or
    ``group(add.s(i, i) for i in range(10))``."""

    def __init__(self, *tasks: Any, app: Celeriac | None = None, **options: Any) -> None:
        if len(tasks) == 1 and isinstance(tasks[0], group):
            tasks = tuple(tasks[0].tasks)
        members = _members(tasks, app)
        super().__init__("celery.group", (), {"tasks": members}, options,
                         subtask_type="group", app=_app_of(members, app))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], app: Celeriac | None = None) -> Signature:
        return cls(list((d.get("kwargs") or {}).get("tasks") or ()), app=app,
                   **(d.get("options") or {}))

    @property
    def tasks(self) -> list[Signature]:
        tasks: list[Signature] = self.kwargs["tasks"]
        return tasks

    def __len__(self) -> int:  # Celery's: the number of members
        return len(self.tasks)

    def link(self, callback: Mapping[str, Any]) -> Signature:
        """Celery's ``group.link``: the callback, made immutable, is linked to the first
        member only (it runs once, when that member succeeds: not after the whole group;
        for that, make it a chord's body: ``group(...) | callback``)."""
        sig = maybe_signature(callback, self._app).clone().set(immutable=True)
        return self.tasks[0].link(sig)

    def link_error(self, errback: Mapping[str, Any]) -> Signature:
        """Celery's ``group.link_error``: linked to every member (any may fail, so it may
        run more than once)."""
        sig = maybe_signature(errback, self._app)
        linked = [member.link_error(sig.clone()) for member in self.tasks]
        return linked[0] if linked else sig

    def __repr__(self) -> str:
        return f"group({self.tasks!r})"

    def stamp(self, visitor: StampingVisitor | None = None,  # type: ignore[override]
              append_stamps: bool = False, **headers: Any) -> None:
        """Stamp every member (and the group's links), as Celery's ``group.stamp``."""
        visitor_headers = None
        if visitor is not None:
            visitor_headers = visitor.on_group_start(self, **headers) or {}
        headers = self._stamp_headers(visitor_headers, append_stamps, **headers)
        self.stamp_links(visitor, append_stamps, **headers)
        for task in self.tasks:
            task.stamp(visitor, append_stamps, **headers)
        if visitor is not None:
            visitor.on_group_end(self, **headers)

    def __call__(self, *args: Any, **options: Any) -> Result:
        return self.apply_async(args, **options)

    def _flat(self) -> Iterator[Signature]:
        """The members, nested groups (and chunks) flattened; not copied: sending and
        ``apply`` apply partial arguments without changing a member."""
        for member in self.tasks:
            member = member._unrolled()
            if isinstance(member, group):
                yield from member._flat()
            else:
                yield member

    def apply_async(self, args: Sequence[Any] | None = None,  # type: ignore[override]
                    kwargs: Mapping[str, Any] | None = None, **options: Any) -> GroupResult:
        """Send every member, ``GROUP_CHUNK`` messages per broker round trip, each with
        the group id in its ``group`` header and its place in ``group_index``."""
        options = {k: v for k, v in options.items() if v is not None}
        if "link" in options or "link_error" in options:
            raise TypeError("cannot link a group: link its members, or make the callback "
                            "a chord's body (group(...) | callback)")
        if self.app.settings.task_always_eager:
            return self.apply(args, kwargs, **options)
        opts = {**self.options, **options}
        only = self.tasks[0] if len(self.tasks) == 1 else None
        if isinstance(only, chain) and only.tasks and isinstance(only.tasks[-1], group) \
                and "group_id" not in opts:  # Celery's special case: group(a | group(b,
            # c)) is that chain, its result the inner group's ([b, c]), not [[b, c]].
            result = only.apply_async(args, kwargs, **opts)
            assert isinstance(result, GroupResult)  # a chain's is its last step's
            return result
        group_id = opts.pop("task_id", None) or new_id()
        retry, policy = opts.pop("retry", None), opts.pop("retry_policy", None)
        results: list[AsyncResult[Any]] = []
        applied: list[tuple[Signature, dict[str, Any]]] = []

        def messages() -> Iterator[Outgoing]:
            for index, member in enumerate(self._flat()):
                member_opts = {**opts, "group_id": group_id, "group_index": index}
                if _applied(member):
                    results.append(_defer(member, member_opts, applied, self.app))
                    continue
                item, res = member._outgoing(args, kwargs, member_opts)
                results.append(res)  # type: ignore[arg-type]  # groups were flattened
                yield item

        self.app.publish_prepared(messages(), chunk_size=GROUP_CHUNK, retry=retry,
                                  retry_policy=policy)
        for member, member_opts in applied:
            member.apply_async(args, kwargs, retry=retry, retry_policy=policy, **member_opts)
        return GroupResult(group_id, results, self.app)

    def apply(self, args: Sequence[Any] | None = None,  # type: ignore[override]
              kwargs: Mapping[str, Any] | None = None, **options: Any) -> GroupResult:
        """Run every member here, in order (eager)."""
        group_id = options.get("task_id") or self.options.get("task_id") or new_id()
        results = [m.apply(args, kwargs) for m in self._flat()]
        return GroupResult(group_id, results, self.app)

    def freeze(self, task_id: str | None = None,  # type: ignore[override]
               **options: Any) -> GroupResult:
        """Assign the group id and the members' task ids now."""
        group_id = self.options.setdefault("task_id", task_id or new_id())
        members = [m.clone() for m in self._flat()]
        self.kwargs["tasks"] = members
        results = [m.freeze(group_id=group_id, group_index=i, root_id=options.get("root_id"),
                            parent_id=options.get("parent_id"))
                   for i, m in enumerate(members)]
        return GroupResult(group_id, results, self.app)


class chord(Signature):
    """A group, then a callback given the list of its results in member order:
    ``chord(header, body)`` or ``group(...) | body``.

    Each header message carries the body in its embed (Celery's wire format) and the
    group id; the member ids are saved under the group id (``GroupResult.save``). Where a
    header task ends, the worker counts it in the result backend (``chord_part``: one
    atomic operation, idempotent per task id); the one count that completes the chord
    sends the body, or stores ``ChordError`` for it if a header task failed. On a backend
    with ``chords_by_unlock`` (Celery's database layout) a ``celery.chord_unlock`` task
    goes with the header instead, and polls it (Celery's way there)."""

    def __init__(self, header: Iterable[Any], body: Mapping[str, Any] | None = None, *,
                 app: Celeriac | None = None, **options: Any) -> None:
        # A generator's members are sent as it yields them (Celery's: a header that is
        # slow to make starts running before it is all made); until the chord is sent,
        # or used any other way, it is not read.
        self._stream: Iterator[Any] | None = header if isinstance(header, Iterator) else None
        if isinstance(header, Mapping) and not isinstance(header, group):
            # One signature (a chain, a chord, a task's) or its dict: a header of one
            # (Celery's ``_maybe_group``); a group's dict is that group.
            header = maybe_signature(header, app)
            if not isinstance(header, group):
                header = [header]
        elif _is_task(header):
            header = [header]
        # Copies (Celery's): linking the chord's errback never changes the caller's.
        members = header if isinstance(header, group) else group(
            [] if self._stream is not None else [_as_signature(t, app).clone()
                                                 for t in header], app=app)
        body_sig = maybe_signature(body, app) if body is not None else None
        super().__init__("celery.chord", (), {"header": members, "body": body_sig},
                         options, subtask_type="chord",
                         app=app or members._app or (body_sig._app if body_sig else None))

    def _read_stream(self) -> None:
        """Any use but sending reads a generator header whole, first."""
        if self._stream is not None:
            stream, self._stream = self._stream, None
            self.kwargs["header"] = group(list(stream), app=self._app)

    def __deepcopy__(self, memo: dict[int, Any]) -> Self:
        self._read_stream()
        return super().__deepcopy__(memo)

    def clone(self, args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
              **options: Any) -> Self:
        self._read_stream()
        return super().clone(args, kwargs, **options)

    def _outgoing(self, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None,
                  options: Mapping[str, Any]) -> tuple[Outgoing, Result]:
        self._read_stream()
        return super()._outgoing(args, kwargs, options)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], app: Celeriac | None = None) -> Signature:
        kw = d.get("kwargs") or {}
        header = kw.get("header") or []
        # The header's own options hold the group id a frozen chord was given.
        members = group.from_dict(header, app) if isinstance(header, Mapping) \
            else list(header)
        return cls(members, kw.get("body"), app=app, **(d.get("options") or {}))

    @property
    def header(self) -> group:
        self._read_stream()
        header: group = self.kwargs["header"]
        return header

    @property
    def tasks(self) -> list[Signature]:
        """The header's tasks (Celery's name for them)."""
        return self.header.tasks

    @tasks.setter
    def tasks(self, value: Any) -> None:
        self._stream = None
        self.kwargs["header"] = value if isinstance(value, group) else group(
            list(value), app=self._app)

    def link_error(self, errback: Mapping[str, Any]) -> Signature:
        """Celery's: linked to the body (``apply_async`` moves it there) and, with
        ``task_allow_error_cb_on_chord_header``, to every header task, immutable."""
        sig = maybe_signature(errback, self._app)
        on_header = self.app.settings.task_allow_error_cb_on_chord_header
        if self._stream is not None:
            # Not read here: each member is linked as the stream yields it.
            self._stream = _linking(self._stream, sig, on_header, self._app)
        else:
            for task in self.tasks:
                _link_header_task(task, sig, on_header)
        return self._append_option("link_error", sig)

    def stamp(self, visitor: StampingVisitor | None = None,  # type: ignore[override]
              append_stamps: bool = False, **headers: Any) -> None:
        """Stamp the header's tasks, the chord's links, and the body (with what
        ``on_chord_body`` adds), as Celery's ``chord.stamp``."""
        visitor_headers = None
        if visitor is not None:
            visitor_headers = visitor.on_chord_header_start(self, **headers) or {}
        headers = self._stamp_headers(visitor_headers, append_stamps, **headers)
        self.stamp_links(visitor, append_stamps, **headers)
        for task in self.tasks:
            task.stamp(visitor, append_stamps, **dict(headers))
        if visitor is not None:
            visitor.on_chord_header_end(self, **headers)
            body = self.kwargs["body"]
            if body is not None:
                visitor_headers = visitor.on_chord_body(self, **headers) or {}
                headers = self._stamp_headers(visitor_headers, append_stamps, **headers)
                body.stamp(visitor, append_stamps, **headers)

    @property
    def body(self) -> Signature:
        body: Signature | None = self.kwargs["body"]
        if body is None:
            raise ValueError("this chord has no body: chord(header, body)")
        return body

    def apply_async(self, args: Sequence[Any] | None = None,
                    kwargs: Mapping[str, Any] | None = None, **options: Any
                    ) -> AsyncResult[Any]:
        """Send the header (in bulk, as a group); returns the body's result, whose
        ``parent`` is the header's ``GroupResult``."""
        options = {k: v for k, v in options.items() if v is not None}
        if self.app.settings.task_always_eager:
            return self.apply(args, kwargs, **options)
        self.app.backend.ensure_chords_allowed()  # Celery's check: rpc:// refuses chords
        opts = {**self.options, **options}
        retry, policy = opts.pop("retry", None), opts.pop("retry_policy", None)
        body = self.body.clone()
        # They belong to the body: its callbacks, the rest of a chain, and the chord's
        # place in a group or in an outer chord's header (the body's result is its).
        for key in ("chain", "group_id", "group_index", "chord"):
            if key in opts:
                body.options[key] = opts.pop(key)
        for callback in _as_list(opts.pop("link", None)):
            body.link(callback)  # a group body: on its first member (Celery's)
        for errback in _as_list(opts.pop("link_error", None)):
            body.link_error(errback)  # a group body: on every member
        body_result = body.freeze(opts.pop("task_id", None))
        if self._stream is not None:
            return self._send_streamed(body, body_result, args, kwargs, opts, retry, policy)
        members = list(self.header._flat())
        if not members:
            # Nothing to wait for: the body runs at once with no results (as Celery).
            return body.apply_async(([],))
        group_id = self.header.options.get("task_id") or new_id()
        body["chord_size"] = len(members)
        carried = plain(body)
        results: list[AsyncResult[Any]] = []
        items = []
        applied: list[tuple[Signature, dict[str, Any]]] = []
        for index, member in enumerate(members):
            member_opts = {**opts, "group_id": group_id, "group_index": index,
                           "chord": carried}
            if _applied(member):
                # A chord (or a chain starting with a group or one) in the header: what
                # ends it is counted in this chord (a chord's body, with its place).
                results.append(_defer(member, member_opts, applied, self.app))
                continue
            item, res = member._outgoing(args, kwargs, member_opts)
            results.append(res)  # type: ignore[arg-type]  # a chain's is its last step's
            items.append(item)
        header_result = GroupResult(group_id, results, self.app)
        # Saved before any header task can finish: the worker that completes the chord
        # reads the member ids (in order) from here.
        header_result.save()
        if self.app.backend.chords_by_unlock:
            items.append(self._unlock(group_id, carried, header_result))
        self.app.publish_prepared(items, chunk_size=GROUP_CHUNK, retry=retry,
                                  retry_policy=policy)
        for member, member_opts in applied:
            member.apply_async(args, kwargs, retry=retry, retry_policy=policy, **member_opts)
        _under(body_result, header_result)
        return body_result

    def _send_streamed(self, body: Signature, body_result: AsyncResult[Any],
                       args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None,
                       opts: dict[str, Any], retry: Any, policy: Any) -> AsyncResult[Any]:
        """A generator header: each member sent as it is yielded, then a
        ``celery.chord_unlock`` that polls the header's results and sends the body (the
        header's size is known only at its end, after its first members may have run)."""
        assert self._stream is not None
        stream, self._stream = self._stream, None
        group_id = self.header.options.get("task_id") or new_id()
        results: list[AsyncResult[Any]] = []
        for yielded in stream:
            for member in group([yielded], app=self._app)._flat():
                member_opts = {**opts, "group_id": group_id, "group_index": len(results)}
                if _applied(member):
                    applied: list[tuple[Signature, dict[str, Any]]] = []
                    results.append(_defer(member, member_opts, applied, self.app))
                    member.apply_async(args, kwargs, retry=retry, retry_policy=policy,
                                       **applied[0][1])
                    continue
                item, res = member._outgoing(args, kwargs, member_opts)
                self.app.publish_prepared([item], chunk_size=1, retry=retry,
                                          retry_policy=policy)
                results.append(res)  # type: ignore[arg-type]  # a chain's: its last step's
        if not results:
            return body.apply_async(([],))
        header_result = GroupResult(group_id, results, self.app)
        header_result.save()
        body["chord_size"] = len(results)
        self.app.publish_prepared([self._unlock(group_id, plain(body), header_result)],
                                  chunk_size=1, retry=retry, retry_policy=policy)
        _under(body_result, header_result)
        return body_result

    def _unlock(self, group_id: str, body: Mapping[str, Any], header: GroupResult) -> Any:
        """Celery's ``fallback_chord_unlock``: the ``celery.chord_unlock`` message that
        polls the header's results and sends the body, routed and prioritised as the body
        is. Sent behind the header (Celery's waits a second first), it looks at once,
        then waits as ``builtins._unlock_chord`` says."""
        options = body.get("options") or {}
        own = self.app.tasks.get(body["task"])
        queue = options.get("queue") or (own.options.queue if own else None) \
            or self.app.route(body["task"])
        unlock = Signature("celery.chord_unlock", (group_id, body), {
            "interval": None, "max_retries": None,
            "result": [r.as_tuple() for r in header.results]}, app=self.app)
        item, _ = unlock._outgoing(None, None, {
            "countdown": 0, "queue": queue, "priority": options.get("priority")})
        return item

    def freeze(self, task_id: str | None = None,
               **options: Any) -> AsyncResult[Any]:
        """Assign the body's id, the group id and the header tasks' ids now; returns the
        body's result, whose ``parent`` is the header's ``GroupResult``."""
        lineage = {"root_id": options.get("root_id"), "parent_id": options.get("parent_id")}
        body_result = self.body.freeze(task_id, **lineage)
        header_result = self.header.freeze(**lineage)
        _under(body_result, header_result)
        return body_result

    def apply(self, args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
              **options: Any) -> AsyncResult[Any]:
        """Run the header here, then the body with its results (eager)."""
        header = self.header.apply(args, kwargs)
        values = header.get(propagate=True)
        result = self.body.apply((values,))
        _under(result, header)
        return result

    def __call__(self, body: Mapping[str, Any] | None = None, **options: Any) -> Any:
        """``chord(header)(body)``: Celery's way to give the body and send."""
        if body is not None:
            self.kwargs["body"] = maybe_signature(body, self._app)
            # The body's app, when the header (a generator, unread) gave none: the chord
            # is sent where its tasks are, not to whichever app is current.
            self._app = self._app or self.kwargs["body"]._app
        return self.apply_async(**options)


def _upgrade(prev: Signature, step: Signature, app: Celeriac | None) -> Signature | None:
    """``prev`` then ``step`` in a chain as one chord, where a group is followed (Celery's
    upgrade); None where they stay two steps."""
    if isinstance(prev, group):
        return chord(prev, step, app=app)
    if isinstance(prev, chord) and prev.kwargs.get("body") is not None:
        body = _upgrade(prev.body, step, app)
        if body is not None and isinstance(prev.body, (group, chord)):
            return chord(prev.header, body, app=app, **prev.options)
    return None


def _link_header_task(task: Signature, errback: Signature, on_header: bool) -> None:
    """With the flag, an immutable copy (Celery's); a chord links it for its own body."""
    if on_header:
        task.link_error(errback.clone().set(immutable=True))
    if isinstance(task, chord):
        task.link_error(errback)


def _linking(stream: Iterator[Any], errback: Signature, on_header: bool,
             app: Celeriac | None) -> Iterator[Signature]:
    for member in stream:
        task = _as_signature(member, app)
        _link_header_task(task, errback, on_header)
        yield task


def _applied(member: Signature) -> bool:
    """Whether a group member or chord header task is no one message and is applied on
    its own (its place in the group given to what ends it): a chord, or a chain that
    starts with a group or a chord."""
    if isinstance(member, chord):
        return True
    if isinstance(member, chain):
        first = member.tasks[0] if member.tasks else None
        while isinstance(first, chain):
            first = first.tasks[0] if first.tasks else None
        return isinstance(first, (group, chord))
    return False


def _defer(member: Signature, options: dict[str, Any],
           applied: list[tuple[Signature, dict[str, Any]]], app: Celeriac
           ) -> AsyncResult[Any]:
    """A member applied on its own once the group's messages are out: its result's id
    (what ends it: a chord's body, a chain's last step) is chosen now."""
    body = member.kwargs.get("body") if isinstance(member, chord) else None
    result_id = (body.id if isinstance(body, Signature) and not isinstance(
        body, (chain, group, chord)) else None) or new_id()
    applied.append((member, {**options, "task_id": result_id}))
    return AsyncResult(result_id, app)


def _under(result: AsyncResult[Any], header: GroupResult) -> None:
    """Hang the header's result above the body's first step: a chained body's result
    keeps its own steps as parents (Celery's ``res.parent`` of a chord's chain body is
    that chain's previous step, and the header's ``GroupResult`` above its first)."""
    first: Any = result
    while isinstance(first.parent, AsyncResult):
        first = first.parent
    first.parent = header


Signature.TYPES.update(chain=chain, group=group, chord=chord)
