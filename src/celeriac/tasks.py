"""``Task``: a function registered with an app, callable locally or through the broker."""

from __future__ import annotations

import asyncio
import contextvars
import enum
import inspect
import logging
import random
import traceback as tb
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Final, Generic, ParamSpec, TypeVar, overload

from . import states
from .backends.base import ResultMeta
from .canvas import Signature
from .canvas.builtins import chunks, xmap, xstarmap
from .errors import Ignore, MaxRetriesExceededError, Retry
from .producer import publish as _publish
from .producer.options import SEND_OPTIONS, SendOptions
from .protocol import new_id
from .result import AsyncResult, EagerResult
from .runtime.aio import run_sync
from .runtime.progress import RUNNING
from .runtime.request import Request as Request
from .runtime.request import _current
from .runtime.request import args_repr as args_repr
from .runtime.request import current_request as current_request
from .runtime.request import short_repr as short_repr
from .signals import ExceptionInfo

if TYPE_CHECKING:
    from .app import Celeriac
    from .runtime.aio import Guard

logger = logging.getLogger("celeriac.tasks")

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

HANDLERS = ("before_start", "on_success", "on_failure", "on_retry", "after_return")
"""Celery's Task methods a ``base=`` class may override; called where the task runs."""


class _Default(enum.Enum):
    DEFAULT = "default"

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Final = _Default.DEFAULT
"""An option left unset: the app's setting applies (where None has a meaning of its own)."""


@dataclass(frozen=True, slots=True)
class TaskOptions:
    name: str
    bind: bool = False
    queue: str | None = None
    priority: int | None = None
    max_retries: int | _Default | None = DEFAULT
    """Celery's: None never stops retrying; unset, ``task_max_retries`` (3)."""
    default_retry_delay: float | None = None
    autoretry_for: tuple[type[BaseException], ...] = ()
    retry_backoff: bool | float = False
    retry_backoff_max: float = 600.0
    retry_jitter: bool = True
    acks_late: bool | None = None
    time_limit: float | None = None
    soft_time_limit: float | None = None
    ignore_result: bool | None = None
    expires: float | timedelta | datetime | None = None
    serializer: str | None = None
    compression: str | None = None
    """``"gzip"``, ``"bzip2"`` or ``"lzma"``; None: ``task_compression``."""
    track_started: bool | None = None
    rate_limit: str | float | None = None
    """Celery's syntax: ``"10/s"``, ``"100/m"``, ``"1000/h"`` or a number per second;
    per worker and task name. None: ``task_default_rate_limit``."""
    global_rate_limit: str | float | None = None
    """The same syntax, one limit shared by every worker of the cluster, enforced
    through the broker's or result backend's store (``worker/globalrate.py``)."""


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

    def __init__(self, app: Celeriac, fn: Callable[..., R], options: TaskOptions) -> None:
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
        if self.options.bind:
            return self.fn(self, *args, **kwargs)
        return self.fn(*args, **kwargs)

    def _autoretry(self, request: Request, exc: Exception) -> None:
        """Raise ``Retry`` when the task retries on ``exc`` (``autoretry_for``, a call
        through the worker or ``apply``); else return, and the caller re-raises ``exc``."""
        if not request.called_directly and self.should_autoretry(exc):
            raise self.retry(exc=exc) from exc

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

    def delay_many(self, calls: Iterable[Sequence[Any] | tuple[Sequence[Any], Mapping[str, Any]]],
                   **options: Any) -> list[AsyncResult[R]]:
        """Send one message per call (args, or ``(args, kwargs)``) in bulk round trips.

        ``add.delay_many([(1, 2), (3, 4)])``; options as ``app.send_many``.
        """
        if self.app.settings.task_always_eager:
            return [self.apply(*_eager_call(c)) for c in calls]
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
        **options: Any,
    ) -> AsyncResult[R]:
        """Send the task with explicit options. ``countdown`` (s) or ``eta`` delay it;
        the other options are Celery's (see ``Celeriac.send_task``); an option celeriac
        does not know raises ``TypeError`` naming it."""
        unknown = options.keys() - SEND_OPTIONS
        if unknown:
            raise TypeError(f"{self.name}.apply_async() got unknown option(s): "
                            f"{', '.join(sorted(unknown))}")
        app = self.app
        if app.settings.task_always_eager:
            return self.apply(args, kwargs, task_id=task_id)
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
        return await asyncio.to_thread(self.apply_async, args, kwargs, **options)

    def apply(self, args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
              *, task_id: str | None = None) -> AsyncResult[R]:
        """Run the task here and now (eager), retries included; nothing is sent."""
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
                    if self.app.settings.task_eager_propagates:
                        raise
                    return EagerResult(task_id, self.app, self.name, meta)
                self._ended(request, meta.state, meta.result)
                return EagerResult(task_id, self.app, self.name, meta)
            finally:
                self.leave(scope)

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
    ) -> Retry:
        """Publish this call again to run later, then raise ``Retry``.

        Use as ``raise self.retry(...)``. Past ``max_retries`` it raises ``exc`` (or
        ``MaxRetriesExceededError``) instead, and the task fails.
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
            new_args = request.args if args is None else args
            new_kwargs = request.kwargs if kwargs is None else kwargs
            self.apply_async(
                new_args, new_kwargs, countdown=countdown, eta=eta, task_id=request.id,
                retries=request.retries + 1, queue=request.delivery_info.get("queue"),
                headers={"root_id": request.root_id, "parent_id": request.parent_id},
            )
        raise Retry(exc=exc, when=countdown if eta is None else eta)

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


def _eager_call(call: Any) -> tuple[Sequence[Any], Mapping[str, Any] | None]:
    if isinstance(call, tuple) and len(call) == 2 and isinstance(call[1], Mapping):
        return call[0], call[1]
    return call, None
