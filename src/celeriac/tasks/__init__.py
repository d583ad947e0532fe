"""``Task``: a function registered with an app, callable locally or through the broker."""

from __future__ import annotations

import contextvars
import inspect
import logging
import random
import traceback as tb
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import fields, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Generic, ParamSpec, TypeVar, overload

from .. import states
from ..backends.base import ResultMeta
from ..canvas import Signature, chain, chord, group, maybe_signature
from ..canvas.builtins import chunks, xmap, xstarmap
from ..canvas.followups import takes_request
from ..canvas.signature import pop_stamps
from ..errors import ConfigurationError, Ignore, MaxRetriesExceededError, Retry
from ..producer import publish as _publish
from ..producer.options import NAMES as SEND_NAMES
from ..producer.options import SEND_OPTIONS, SendOptions
from ..protocol import new_id
from ..result import AsyncResult, EagerResult, GroupResult
from ..runtime.progress import RUNNING
from ..runtime.request import Request as Request
from ..runtime.request import _current
from ..runtime.request import args_repr as args_repr
from ..runtime.request import current_request as current_request
from ..runtime.request import short_repr as short_repr
from ..runtime.state import get_current_app
from ..signals import ExceptionInfo
from . import django_commit as _django_commit
from .arguments import (
    STANDARD_HEADERS,
    argument_checker,
    eager_call,
    listed,
    pydantic_wrapper,
)
from .options import DEFAULT as DEFAULT
from .options import TaskOptions as TaskOptions
from .options import class_based

if TYPE_CHECKING:
    from ..app import Celeriac
    from ..runtime.aio import Guard

logger = logging.getLogger("celeriac.tasks")

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

HANDLERS = ("before_start", "on_success", "on_failure", "on_retry", "after_return")
"""Celery's Task methods a ``base=`` class may override; called where the task runs."""


class Task(Generic[P, R]):
    """A registered task. Call it to run it here; ``delay()`` to run it on a worker.

    Subclass it for ``@app.task(base=MyTask)``: class attributes named like task options
    (``max_retries = 5``, ``acks_late = True``, ``rate_limit = "10/m"``...) are defaults,
    and Celery's handlers below run where the task runs (a handler that raises is
    logged; the task's outcome stands)."""

    option_defaults: ClassVar[dict[str, Any]] = {}
    """Task options a subclass sets as class attributes (defaults for its tasks)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        names = {f.name for f in fields(TaskOptions)} - {"name"}
        own = {k: v for k, v in vars(cls).items() if k in names}
        cls.option_defaults = {**cls.option_defaults, **own}
        for name in own.keys() & {"max_retries", "acks_late", "ignore_result"}:
            # The property resolves options, annotations and settings in one place; a
            # class attribute of the same name would hide it.
            delattr(cls, name)

    def __init__(self, app: Celeriac | None = None, fn: Callable[..., R] | None = None,
                 options: TaskOptions | None = None) -> None:
        if fn is None or options is None or app is None:
            # Celery's class-based task made bare, ``T()``: its ``run`` method, its class
            # attributes as options, the current app (``app.register_task(T())``).
            app = app if app is not None else get_current_app()
            fn, options = class_based(type(self))
        self.app = app
        self.fn = fn
        self.options = options
        self.name = options.name
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        self._request: contextvars.ContextVar[Request | None] = contextvars.ContextVar(
            f"celeriac.request.{self.name}", default=None
        )
        self.is_async = inspect.iscoroutinefunction(fn)
        """An ``async def`` task: it runs on an event loop (``arun_with``)."""
        self.has_handlers = any(getattr(type(self), h) is not getattr(Task, h)
                                for h in HANDLERS)
        """True when a subclass overrides a handler (checked once, not per task)."""
        self._defaults: tuple[TaskOptions, Any, SendOptions] | None = None
        """``delay()``'s options, for the task options and settings they came from."""
        self._checker: tuple[Callable[..., Any], Callable[..., Any] | None] | None = None
        """``typing``'s argument check, for the function it was made from (None: not yet
        made; a None check: the function's signature cannot be read)."""
        self._pydantic_fn: tuple[Callable[..., Any], Callable[..., Any]] | None = None
        """``pydantic``'s wrapper, for the function it wraps (made when the task first runs,
        so pydantic is imported only where such a task runs)."""

    # -- Celery's handlers ---------------------------------------------------------------
    def before_start(self, task_id: str, args: Sequence[Any], kwargs: Mapping[str, Any]
                     ) -> None:
        """Before the task runs."""

    def on_success(self, retval: Any, task_id: str, args: Sequence[Any],
                   kwargs: Mapping[str, Any]) -> None:
        """After the task returned ``retval``."""

    def on_failure(self, exc: BaseException, task_id: str, args: Sequence[Any],
                   kwargs: Mapping[str, Any], einfo: Any) -> None:
        """After the task failed (``einfo``: ``celeriac.signals.ExceptionInfo``)."""

    def on_retry(self, exc: BaseException, task_id: str, args: Sequence[Any],
                 kwargs: Mapping[str, Any], einfo: Any) -> None:
        """After the task asked to be retried."""

    def after_return(self, status: str, retval: Any, task_id: str, args: Sequence[Any],
                     kwargs: Mapping[str, Any], einfo: Any) -> None:
        """After the task ended, whatever its state."""

    def call_handlers(self, request: Request, state: str | None, retval: Any) -> None:
        """``on_success`` / ``on_failure`` / ``on_retry``, then ``after_return``."""
        exc = retval if isinstance(retval, BaseException) else None
        einfo = ExceptionInfo(exc) if exc is not None else None
        args, kwargs = request.args, request.kwargs
        try:
            if state == states.SUCCESS:
                self.on_success(retval, request.id, args, kwargs)
            elif state == states.FAILURE and exc is not None:
                self.on_failure(exc, request.id, args, kwargs, einfo)
            elif state == states.RETRY and exc is not None:
                self.on_retry(exc, request.id, args, kwargs, einfo)
            if state is not None:
                self.after_return(state, retval, request.id, args, kwargs, einfo)
        except Exception:
            logger.exception("Task %s[%s]: a handler of %s failed", self.name, request.id,
                             type(self).__name__)

    def __repr__(self) -> str:
        return f"<Task {self.name}>"

    # -- settings resolved against the app's ----------------------------------------------
    @property
    def max_retries(self) -> int | None:
        """Retries allowed; None: no limit."""
        o = self.options.max_retries
        return self.app.settings.task_max_retries if o is DEFAULT else o

    @property
    def acks_late(self) -> bool:
        o = self.options.acks_late
        return self.app.settings.task_acks_late if o is None else o

    @property
    def ignore_result(self) -> bool:
        o = self.options.ignore_result
        return self.app.settings.task_ignore_result if o is None else o

    @property
    def request(self) -> Request:
        """The current call's request; outside a call, an empty one (called_directly)."""
        return self._request.get() or Request(task=self.name)

    # -- running ------------------------------------------------------------------------
    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function in this process, as a plain call. For an ``async def`` task
        this returns the coroutine, as calling the function does (``self.request`` is
        this call's inside it)."""
        if self.is_async:
            coro: Any = self.arun_with(Request(task=self.name), args, kwargs)
            return coro  # type: ignore[no-any-return]
        return self.run_with(Request(task=self.name), args, kwargs)

    def enter(self, request: Request) -> tuple[Any, Any]:
        """Make ``request`` this task's and the thread's current one; ``leave`` undoes."""
        return self._request.set(request), _current.set(request)

    def leave(self, tokens: tuple[Any, Any]) -> None:
        _current.reset(tokens[1])
        self._request.reset(tokens[0])

    # run_with and arun_with are one call with a sync and an async edge: ``enter``, then
    # ``_invoke`` (before_start and the function), ``_autoretry`` on an exception,
    # ``leave``; the edges differ only in that the async one awaits what _invoke made.
    def run_with(self, request: Request, args: Sequence[Any], kwargs: Mapping[str, Any]) -> R:
        """Call the function with ``request`` current (``self.request``,
        ``current_request()``); an exception in ``autoretry_for`` becomes ``Retry``."""
        scope = self.enter(request)
        try:
            return self._invoke(request, args, kwargs)  # type: ignore[no-any-return]
        except Exception as exc:
            self._autoretry(request, exc)
            raise
        finally:
            self.leave(scope)

    async def arun_with(self, request: Request, args: Sequence[Any],
                        kwargs: Mapping[str, Any], guard: Guard | None = None) -> Any:
        """``run_with`` for an ``async def`` task. Awaited in its own asyncio task, so the
        context variables set here (``self.request``, ``current_request()``) belong to
        this call alone, however many run on the loop. ``guard`` carries its time limits
        (``runtime.aio.Guard``: raised at the await the task waits in)."""
        scope = self.enter(request)
        try:
            coro = self._invoke(request, args, kwargs)
            return await (coro if guard is None else guard.wrap(coro))
        except Exception as exc:
            self._autoretry(request, exc)
            raise
        finally:
            self.leave(scope)

    def _invoke(self, request: Request, args: Sequence[Any], kwargs: Mapping[str, Any]
                ) -> Any:
        """``before_start``, then the function: its value (the coroutine, for an ``async
        def`` task)."""
        if self.has_handlers and not request.called_directly:
            self.before_start(request.id, args, kwargs)
        fn = self._pydantic() if self.options.pydantic else self.fn
        if self.options.bind:
            return fn(self, *args, **kwargs)
        return fn(*args, **kwargs)

    def _pydantic(self) -> Callable[..., Any]:
        """The function wrapped for ``pydantic=True`` (made once per function)."""
        made = self._pydantic_fn
        if made is None or made[0] is not self.fn:
            o = self.options
            made = self._pydantic_fn = (self.fn, pydantic_wrapper(
                self.fn, self.name, o.bind, o.pydantic_strict, o.pydantic_context,
                o.pydantic_dump_kwargs, self.app))
        return made[1]

    def check_arguments(self, args: Sequence[Any] | None,
                        kwargs: Mapping[str, Any] | None) -> None:
        """Celery's ``typing=True`` check: ``TypeError`` when the function cannot be
        called with these arguments (the check made once per function, a stub of its
        signature: a plain call's cost)."""
        made = self._checker
        if made is None or made[0] is not self.fn:
            made = self._checker = (self.fn, argument_checker(self.fn, self.options.bind))
        check = made[1]
        # Arguments of the wrong shape are the producer's to refuse, saying so.
        if check is not None and (args is None or isinstance(args, (list, tuple))) and (
                kwargs is None or isinstance(kwargs, Mapping)):
            try:
                check(*(args or ()), **(kwargs or {}))
            except TypeError as exc:
                raise TypeError(f"{self.name}: {exc}") from None

    def _autoretry(self, request: Request, exc: Exception) -> None:
        """Raise ``Retry`` when the task retries on ``exc`` (``autoretry_for``, a call
        through the worker or ``apply``); else return, and the caller re-raises ``exc``."""
        if not request.called_directly and self.should_autoretry(exc):
            raise self.retry(exc=exc, **(self.options.retry_kwargs or {})) from exc

    # -- sending ------------------------------------------------------------------------
    # An ``async def`` task's result is what its coroutine returns: for type checkers,
    # ``delay()`` of a ``Task[P, Coroutine[Any, Any, T]]`` is an ``AsyncResult[T]``.
    @overload
    def delay(self: Task[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs
              ) -> AsyncResult[T]: ...

    @overload
    def delay(self, *args: P.args, **kwargs: P.kwargs) -> AsyncResult[R]: ...

    def delay(self, *args: P.args, **kwargs: P.kwargs) -> AsyncResult[Any]:
        """Send the task to a worker with these arguments."""
        return self.apply_async(args, kwargs)

    delay_on_commit = _django_commit.delay_on_commit  # Celery 5.4's, on every task
    apply_async_on_commit = _django_commit.apply_async_on_commit

    def delay_many(self, calls: Iterable[Sequence[Any] | tuple[Sequence[Any], Mapping[str, Any]]],
                   **options: Any) -> list[AsyncResult[R]]:
        """Send one message per call (args, or ``(args, kwargs)``) in bulk round trips.

        ``add.delay_many([(1, 2), (3, 4)])``; options as ``app.send_many``.
        """
        if self.app.settings.task_always_eager:
            return [self.apply(*eager_call(c)) for c in calls]
        o = self.options
        options.setdefault("queue", o.queue)
        options.setdefault("priority", o.priority)
        options.setdefault("serializer", o.serializer)
        options.setdefault("compression", o.compression)
        return self.app.send_many(self.name, calls, **options)

    # -- canvas ------------------------------------------------------------------------
    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A signature of this task: ``add.s(2, 2)``; partial (``add.s(2)``) is fine."""
        return Signature(self, args, kwargs, app=self.app)

    def si(self, *args: Any, **kwargs: Any) -> Signature:
        """An immutable signature: it ignores the arguments a chain would pass it."""
        return Signature(self, args, kwargs, immutable=True, app=self.app)

    def signature(self, args: Sequence[Any] | None = None,
                  kwargs: Mapping[str, Any] | None = None, **options: Any) -> Signature:
        """A signature with ``apply_async`` options: ``add.signature((2, 2), countdown=10)``."""
        return Signature(self, args, kwargs, app=self.app, **options)

    def map(self, it: Iterable[Any]) -> xmap:
        """``[self(item) for item in it]``, run by one worker task (``celery.map``)."""
        return xmap(self, it, app=self.app)

    def starmap(self, it: Iterable[Any]) -> xstarmap:
        """``[self(*item) for item in it]``, run by one worker task (``celery.starmap``)."""
        return xstarmap(self, it, app=self.app)

    def chunks(self, it: Iterable[Any], n: int) -> chunks:
        """The items (argument tuples) in parts of ``n``: a group of starmap tasks."""
        return chunks(self, it, n, app=self.app)

    async def adelay(self, *args: P.args, **kwargs: P.kwargs) -> AsyncResult[R]:
        return await self.aapply_async(args, kwargs)

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        countdown: float | None = None,
        eta: datetime | None = None,
        expires: float | timedelta | datetime | None = None,
        queue: str | None = None,
        priority: int | None = None,
        task_id: str | None = None,
        headers: Mapping[str, Any] | None = None,
        serializer: str | None = None,
        retries: int = 0,
        time_limit: float | None = None,
        soft_time_limit: float | None = None,
        ignore_result: bool | None = None,
        throw: bool | None = None,
        **options: Any,
    ) -> AsyncResult[R]:
        """Send the task with explicit options. ``countdown`` (s) or ``eta`` delay it;
        the other options are Celery's (see ``Celeriac.send_task``); an option celeriac
        does not know raises ``TypeError`` naming it. ``throw`` applies when the call
        runs eagerly (``task_always_eager``): as ``apply(throw=)``."""
        if "stamped_headers" in options:
            # Celery's send_task: the stamps it names leave the options and travel as
            # the message's ``stamped_headers``/``stamps`` headers.
            options["headers"] = headers
            pop_stamps(options)
            headers = options.pop("headers")
        unknown = options.keys() - SEND_OPTIONS
        if unknown:
            raise TypeError(f"{self.name}.apply_async() got unknown option(s): "
                            f"{', '.join(sorted(unknown))}")
        if self.options.typing:
            self.check_arguments(args, kwargs)
        app = self.app
        if app.settings.task_always_eager:
            return self.apply(args, kwargs, task_id=task_id, throw=throw,
                              link=options.get("link"), link_error=options.get("link_error"))
        if "link" in options or "link_error" in options:
            link, link_error = options.pop("link", None), options.pop("link_error", None)
            if link is not None or link_error is not None:
                options["embed"] = {"callbacks": app._linked(link, "link"),
                                    "errbacks": app._linked(link_error, "link_error")}
        # What the call gives overrides the task's own; None (and an empty queue or
        # serializer) leaves it.
        given = {k: v for k, v in (
            ("countdown", countdown), ("eta", eta), ("expires", expires),
            ("queue", queue or None), ("priority", priority), ("task_id", task_id),
            ("headers", headers), ("serializer", serializer or None),
            ("retries", retries or None), ("time_limit", time_limit),
            ("soft_time_limit", soft_time_limit), ("ignore_result", ignore_result),
            *options.items()) if v is not None}
        # delay() gives nothing: the task's own, made and checked once per task and settings.
        send = replace(self._task_options(), **given).check() if given \
            else self._default_options()
        return _publish.send(app, self.name, args, kwargs, send)

    def _default_options(self) -> SendOptions:
        """The options of a send with none given: the task's own, checked once (again
        when the task's options or the app's settings are replaced)."""
        o, settings = self.options, self.app.settings
        cached = self._defaults
        if cached is not None and cached[0] is o and cached[1] is settings:
            return cached[2]
        send = self._task_options().check()
        self._defaults = (o, settings, send)
        return send

    def _task_options(self) -> SendOptions:
        """The task's own send options (unchecked), which a call's override."""
        o = self.options
        return SendOptions(
            expires=o.expires, queue=o.queue, priority=o.priority, serializer=o.serializer,
            compression=o.compression, time_limit=o.time_limit,
            soft_time_limit=o.soft_time_limit, ignore_result=self.ignore_result)

    async def aapply_async(self, args: Sequence[Any] | None = None,
                           kwargs: Mapping[str, Any] | None = None, **options: Any
                           ) -> AsyncResult[R]:
        """``apply_async`` for async code: the event loop never waits on the broker."""
        import asyncio  # deferred: ~20 ms (ssl, subprocess); an awaiting caller has it

        return await asyncio.to_thread(self.apply_async, args, kwargs, **options)

    def apply(self, args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
              *, task_id: str | None = None, link: Any = None, link_error: Any = None,
              throw: bool | None = None, **options: Any) -> AsyncResult[R]:
        """Run the task here and now (eager), retries included; nothing is sent. ``link``
        signatures run here after a success, with the value; ``link_error`` ones after a
        failure (Celery's two forms: a task taking ``(request, exc, traceback)`` is
        called so, another is applied with the task's id). ``throw``: re-raise a
        failure (None: ``task_eager_propagates``). Other ``apply_async`` options are
        accepted and have no effect here (Celery's)."""
        unknown = options.keys() - SEND_NAMES
        if unknown:
            raise TypeError(f"{self.name}.apply() got unknown option(s): "
                            f"{', '.join(sorted(unknown))}")
        result = self._apply(args, kwargs, task_id, throw, link_error)
        if link is not None and result.successful():
            value = result.get()
            for callback in listed(link):
                maybe_signature(callback, self.app).apply((value,))
        return result

    def _apply(self, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None,
               task_id: str | None, throw: bool | None, link_error: Any) -> AsyncResult[R]:
        task_id = task_id or new_id()
        args, kwargs = list(args or ()), dict(kwargs or {})
        retries = 0
        while True:
            request = Request(id=task_id, task=self.name, args=args, kwargs=kwargs,
                              retries=retries, root_id=task_id, is_eager=True,
                              called_directly=False)
            hooks = self.app.hooks
            scope = self.enter(request)
            try:
                if hooks:
                    hooks.call("before_task", request)
                try:
                    if self.is_async:
                        # deferred: runtime.aio imports asyncio (~20 ms), for async tasks only
                        from ..runtime.aio import run_sync

                        value = run_sync(self.arun_with(request, args, kwargs))
                    else:
                        value = self.run_with(request, args, kwargs)
                    meta = ResultMeta(task_id, states.SUCCESS, value)
                except Retry as r:
                    self._ended(request, states.RETRY, r.exc or r)
                    retries += 1
                    continue
                except Ignore:
                    meta = ResultMeta(task_id, states.SUCCESS, None)
                except Exception as exc:
                    meta = ResultMeta(task_id, states.FAILURE, exc, tb.format_exc(),
                                      retries=retries)
                    self._ended(request, states.FAILURE, exc)
                    if link_error is not None:
                        self._eager_errbacks(request, exc, meta.traceback, link_error)
                    if self.app.settings.task_eager_propagates if throw is None else throw:
                        raise
                    return EagerResult(task_id, self.app, self.name, meta)
                self._ended(request, meta.state, meta.result)
                return EagerResult(task_id, self.app, self.name, meta)
            finally:
                self.leave(scope)

    def _eager_errbacks(self, request: Request, exc: BaseException, traceback: str | None,
                        errbacks: Any) -> None:
        for errback in listed(errbacks):
            sig = maybe_signature(errback, self.app)
            try:
                task = self.app.tasks.get(sig.task)
                if task is not None and takes_request(task):
                    sig.apply((request, exc, traceback))
                else:
                    sig.apply((request.id,))
            except Exception:
                logger.exception("Task %s[%s]: errback %s failed", self.name, request.id,
                                 sig.task)

    def _ended(self, request: Request, state: str, retval: Any) -> None:
        if self.has_handlers:
            self.call_handlers(request, state, retval)
        if self.app.hooks:
            self.app.hooks.call("after_task", request, state, retval)

    # -- progress -----------------------------------------------------------------------
    def update_state(self, task_id: str | None = None, state: str | None = None,
                     meta: Any = None, **kwargs: Any) -> None:
        """Store a state for a task (by default the running one) before it ends, e.g.
        ``self.update_state(state="PROGRESS", meta={"done": 40, "total": 100})``; callers
        read it as ``AsyncResult.state`` and ``.info``. Any state name may be used.

        With task events on (``-E``), a call for a task that runs in this executor (the
        running task, or another id it runs) also sends a ``task-progress`` event from
        the worker, at most one per 0.1 s per task, the last one before the task's final
        event; a call for a task that runs elsewhere only stores."""
        task_id = task_id or self.request.id
        if not task_id:
            raise ValueError("update_state needs task_id= outside a running task")
        if not isinstance(state, str) or not state:
            raise ValueError(f"state must be a non-empty string, got {state!r}")
        if kwargs:
            raise TypeError(f"update_state() got unexpected keyword argument(s): "
                            f"{', '.join(sorted(kwargs))}")
        self.app.backend.store(task_id, state, meta, retries=self.request.retries)
        reporter = RUNNING.get(task_id)
        if reporter is not None:
            reporter.report(task_id, state, meta)

    # -- replacing ----------------------------------------------------------------------
    def replace(self, sig: Mapping[str, Any]) -> Any:
        """Celery's ``Task.replace``: end this task and run ``sig`` in its place. The
        replacement takes this task's id (its last task does: callers waiting on this
        task's result get the replacement's), its place in a group or chord, its
        ``link``/``link_error`` callbacks and the rest of its chain; a group is made a
        chord whose body collects the results (``celery.accumulate``). The task ends with
        ``Ignore`` (nothing stored for it; use ``raise self.replace(...)``); eagerly, the
        replacement runs here and its value is returned."""
        request = self.request
        app = self.app
        sig = maybe_signature(sig, app)
        if sig.options.get("chord") is not None:
            raise ConfigurationError("A signature replacing a task must not be part of a "
                                     "chord")
        if isinstance(sig, chain) and not sig.tasks:
            raise ConfigurationError("Cannot replace with an empty chain")
        steps = [self._accumulated(s) for s in (sig.tasks if isinstance(sig, chain)
                                                  else [sig])]
        links = [*listed(sig.options.pop("link", None)), *(request.callbacks or ())] \
            if isinstance(sig, chain) else list(request.callbacks or ())
        errbacks = [*listed(sig.options.pop("link_error", None)),
                    *(request.errbacks or ())] if isinstance(sig, chain) \
            else list(request.errbacks or ())
        # The task that ends the replacement stands for this one: its id, its callbacks,
        # its place in a group or chord (a chord's: its body).
        last = steps[-1]
        tail = last.body if isinstance(last, chord) else last
        tail.options["task_id"] = request.id
        for callback in links:
            tail.link(callback)
        nesting = request.replaced_task_nesting + 1
        rest = [Signature.from_dict(d, app) for d in reversed(request.chain or ())]
        for step in steps:
            for errback in errbacks:
                step.link_error(errback)
        for step in [*steps, *rest, tail]:
            step.options["headers"] = {**(step.options.get("headers") or {}),
                                       "replaced_task_nesting": nesting}
        if not rest:  # else the chain's last step has its place already
            tail.options.update({k: v for k, v in (("chord", request.chord),
                                                   ("group_id", request.group),
                                                   ("group_index", request.group_index))
                                 if v is not None})
        steps += rest
        whole = steps[0] if len(steps) == 1 else chain(
            *steps, app=app, **(sig.options if isinstance(sig, chain) else {}))
        return self.on_replace(whole)

    def add_to_chord(self, sig: Mapping[str, Any], lazy: bool = False) -> AsyncResult[Any]:
        """Celery's ``Task.add_to_chord``: add ``sig`` (a task, a chain, a chord) to the
        chord this task is a header task of; the chord's body gets its result too, after
        the others'. It is sent when this task ends, and this task's part of the chord
        is counted once it has run. Returns its result."""
        request = self.request
        if not request.chord or not request.group:
            raise ValueError("Current task is not member of any chord")
        if lazy:
            raise NotImplementedError("add_to_chord(lazy=True): celeriac sends what is "
                                      "added itself, as the task ends")
        sig = maybe_signature(sig, self.app)
        target = sig.body if isinstance(sig, chord) else sig
        result_id = target.options.get("task_id") or new_id()
        target.options["task_id"] = result_id
        saved = GroupResult.restore(request.group, app=self.app)
        if saved is None:
            raise ValueError(f"chord {request.group}: its member list is gone (expired?)")
        result: AsyncResult[Any] = AsyncResult(result_id, self.app, target.task)
        GroupResult(request.group, [*saved.results, result], self.app).save()
        request.chord_additions = [*(request.chord_additions or ()), sig]
        return result

    def on_replace(self, sig: Signature) -> Any:
        """Celery's handler: send ``sig`` in this task's place and end it with ``Ignore``
        (eagerly: run it here and return its value). An override must return
        ``super().on_replace(sig)``."""
        if self.request.is_eager:
            return sig.apply().get()
        sig.apply_async()
        raise Ignore("Replaced by new task")

    def _accumulated(self, sig: Signature) -> Signature:
        """A group as a chord whose body returns the list of its results (Celery's)."""
        if isinstance(sig, group):
            return chord(sig, self.app.signature("celery.accumulate", kwargs={"index": 0}),
                         app=self.app)
        return sig

    # -- retrying -----------------------------------------------------------------------
    def retry(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        exc: BaseException | None = None,
        countdown: float | None = None,
        eta: datetime | None = None,
        max_retries: int | None = None,
        expires: float | timedelta | datetime | None = None,
        **options: Any,
    ) -> Retry:
        """Publish this call again to run later, then raise ``Retry``.

        Use as ``raise self.retry(...)``. Past ``max_retries`` it raises ``exc`` (or
        ``MaxRetriesExceededError``) instead, and the task fails. The new message keeps
        the call's queue, priority, time limits, custom headers, group and what follows
        it (chain, callbacks, chord); ``expires`` and other ``apply_async`` options (Celery's
        ``**options``) apply to it.
        """
        request = self.request
        limit = self.max_retries if max_retries is None else max_retries
        if limit is not None and request.retries >= limit:
            if exc is not None:
                raise exc
            raise MaxRetriesExceededError(
                f"{self.name}[{request.id}] exceeded max_retries={limit}"
            )
        if countdown is None and eta is None:
            countdown = self._retry_countdown(request.retries)
        if request.called_directly:
            raise Retry(exc=exc, when=countdown)  # nothing to publish outside a worker
        if not request.is_eager:
            self._send_retry(request, args, kwargs, countdown, eta, expires, options)
        raise Retry(exc=exc, when=countdown if eta is None else eta)

    def _send_retry(self, request: Request, args: Sequence[Any] | None,
                    kwargs: Mapping[str, Any] | None, countdown: float | None,
                    eta: datetime | None, expires: Any, options: dict[str, Any]) -> None:
        options = dict(options)
        pop_stamps(options)  # retry(stamped_headers=[...], name=value): Celery's
        unknown = options.keys() - SEND_NAMES
        if unknown:
            raise TypeError(f"{self.name}.retry() got unknown option(s): "
                            f"{', '.join(sorted(unknown))}")
        headers = request.headers
        # The call's own headers, its stamps among them, go again (Celery's
        # ``signature_from_request``); the retry's own over them.
        custom = {k: v for k, v in headers.items() if k not in STANDARD_HEADERS}
        custom.update(options.pop("headers", None) or {})
        embed = {"callbacks": request.callbacks, "errbacks": request.errbacks,
                 "chain": request.chain, "chord": request.chord}
        given = {k: v for k, v in (
            ("countdown", countdown), ("eta", eta), ("expires", expires),
            ("queue", request.delivery_info.get("queue")),
            ("priority", request.delivery_info.get("priority")),
            ("headers", custom or None), ("group_id", request.group),
            ("group_index", request.group_index), ("shadow", headers.get("shadow")),
            ("ignore_result", headers.get("ignore_result") or None),
            ("time_limit", request.timelimit[0]), ("soft_time_limit", request.timelimit[1]),
            ("embed", embed if any(embed.values()) else None),
            *options.items()) if v is not None}
        send = replace(self._task_options(), task_id=request.id,
                       retries=request.retries + 1, root_id=request.root_id,
                       parent_id=request.parent_id, add_to_parent=False, **given).check()
        _publish.send(self.app, self.name, request.args if args is None else args,
                      request.kwargs if kwargs is None else kwargs, send)

    def _retry_countdown(self, retries: int) -> float:
        o = self.options
        if o.retry_backoff:
            factor = 1.0 if o.retry_backoff is True else float(o.retry_backoff)
            countdown = min(factor * (2**retries), o.retry_backoff_max)
            return random.uniform(0, countdown) if o.retry_jitter else countdown
        if o.default_retry_delay is not None:
            return o.default_retry_delay
        return self.app.settings.task_default_retry_delay

    def should_autoretry(self, exc: BaseException) -> bool:
        return bool(self.options.autoretry_for) and isinstance(exc, self.options.autoretry_for)
