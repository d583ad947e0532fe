"""``Celeriac``: the application object that registers tasks and sends them."""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Concatenate, Literal, ParamSpec, TypeVar, overload

from . import result as _result
from . import serialization
from .backends.base import ResultBackend, create_backend
from .errors import ConfigurationError, EncodeError
from .hooks import HookRunner, Hooks
from .protocol import Message, new_id, task_headers, task_properties, utcnow
from .settings import Settings
from .tasks import Task, TaskOptions, args_repr
from .transports.base import Outgoing, Publisher, Transport, create_transport

if TYPE_CHECKING:
    from .events import EventDispatcher
    from .worker import Worker

P = ParamSpec("P")
R = TypeVar("R")

logger = logging.getLogger("celeriac.app")


class Celeriac:
    """A celeriac application: settings, a task registry, a broker and a result backend.

    ``Celeriac("proj")`` uses the embedded SQLite broker and result store
    (``sqlite:///celeriac.db``). Settings may be given as a ``Settings`` object, as
    keyword arguments, or both (keywords win)::

        app = Celeriac("proj", broker="sqlite:///jobs.db", task_acks_late=True)
    """

    def __init__(
        self,
        main: str | None = None,
        *,
        broker: str | None = None,
        backend: str | None = None,
        settings: Settings | None = None,
        **overrides: Any,
    ) -> None:
        self.main = main
        base = settings or Settings()
        if broker is not None:
            overrides["broker_url"] = broker
        if backend is not None:
            overrides["result_backend"] = backend
        self.settings = base.replace(**overrides) if overrides else base
        self.tasks: dict[str, Task[Any, Any]] = {}
        self.hooks = HookRunner()
        self._transport: Transport | None = None
        self._relay: Publisher | None = None
        """In a pool child whose broker lives in the worker's memory: where it publishes."""
        self._backend: ResultBackend | None = None
        self._events: EventDispatcher | None = None
        self._pid = os.getpid()

    def __repr__(self) -> str:
        return f"<Celeriac {self.main or '__main__'} broker={self.settings.broker_url}>"

    @property
    def conf(self) -> Settings:
        """Celery's name for the settings."""
        return self.settings

    def configure(self, **changes: Any) -> None:
        """Change settings before the broker or backend is first used."""
        if self._transport is not None or self._backend is not None:
            raise ConfigurationError("configure() must be called before the app connects")
        self.settings = self.settings.replace(**changes)

    # -- connections (per process: a forked child opens its own) -----------------------
    @property
    def transport(self) -> Transport:
        if self._transport is None or self._pid != os.getpid():
            self._reset_after_fork()
            self._transport = create_transport(self.settings.broker_url, self.settings)
        return self._transport

    @property
    def publisher(self) -> Publisher:
        """Where ``send_task`` publishes: the transport, or a pool child's relay."""
        if self._relay is not None and self._pid == os.getpid():
            return self._relay
        return self.transport

    @property
    def backend(self) -> ResultBackend:
        if self._backend is None or self._pid != os.getpid():
            self._reset_after_fork()
            self._backend = create_backend(self.settings.backend_url, self.settings)
        return self._backend

    @property
    def events(self) -> EventDispatcher:
        """This process's dispatcher of producer events (``task-sent``)."""
        if self._events is None or self._pid != os.getpid():
            self._reset_after_fork()
            from .events import EventDispatcher

            self._events = EventDispatcher(self, groups=("task",))
        return self._events

    def _reset_after_fork(self) -> None:
        if self._pid != os.getpid():
            # The parent's connections belong to the parent: drop, never close, them.
            self._transport = self._backend = self._events = self._relay = None
            self._pid = os.getpid()

    def close(self) -> None:
        if self._events is not None:
            self._events.close()
            self._events = None
        if self._transport is not None:
            self._transport.close()
        if self._backend is not None:
            self._backend.close()
        self._transport = self._backend = None

    def add_hooks(self, hooks: Hooks) -> None:
        self.hooks.add(hooks)

    # -- tasks --------------------------------------------------------------------------
    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self, fn: None = None, /, *, bind: Literal[True], name: str | None = ...,
        queue: str | None = ...,
        priority: int | None = ..., max_retries: int | None = ...,
        default_retry_delay: float | None = ...,
        autoretry_for: tuple[type[BaseException], ...] = ..., retry_backoff: bool | float = ...,
        retry_backoff_max: float = ..., retry_jitter: bool = ..., acks_late: bool | None = ...,
        time_limit: float | None = ..., soft_time_limit: float | None = ...,
        ignore_result: bool | None = ..., expires: float | timedelta | datetime | None = ...,
        serializer: str | None = ..., track_started: bool | None = ...,
    ) -> Callable[[Callable[Concatenate[Any, P], R]], Task[P, R]]: ...

    @overload
    def task(
        self, fn: None = None, /, *, bind: Literal[False] = ..., name: str | None = ...,
        queue: str | None = ...,
        priority: int | None = ..., max_retries: int | None = ...,
        default_retry_delay: float | None = ...,
        autoretry_for: tuple[type[BaseException], ...] = ..., retry_backoff: bool | float = ...,
        retry_backoff_max: float = ..., retry_jitter: bool = ..., acks_late: bool | None = ...,
        time_limit: float | None = ..., soft_time_limit: float | None = ...,
        ignore_result: bool | None = ..., expires: float | timedelta | datetime | None = ...,
        serializer: str | None = ..., track_started: bool | None = ...,
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    def task(self, fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
        """Register a function as a task: ``@app.task`` or ``@app.task(bind=True, ...)``."""
        if fn is not None:
            return self._register(fn, options)

        def decorator(f: Callable[..., Any]) -> Task[Any, Any]:
            return self._register(f, options)

        return decorator

    def _register(self, fn: Callable[..., Any], options: dict[str, Any]) -> Task[Any, Any]:
        if not callable(fn):
            raise TypeError(f"@app.task needs a function, got {type(fn).__name__}")
        name = options.pop("name", None) or self._default_name(fn)
        _validate_priority(options.get("priority"))
        if options.get("serializer") is not None:
            serialization.get_serializer(options["serializer"])
        try:
            task_options = TaskOptions(name=name, **options)
        except TypeError as exc:
            raise TypeError(f"@app.task: {exc}") from None
        task: Task[Any, Any] = Task(self, fn, task_options)
        if name in self.tasks and self.tasks[name].fn is not fn:
            logger.warning("task %s registered twice; the later definition wins", name)
        self.tasks[name] = task
        return task

    def _default_name(self, fn: Callable[..., Any]) -> str:
        module = fn.__module__
        if module == "__main__" and self.main:
            module = self.main
        return f"{module}.{fn.__qualname__}"

    def route(self, task_name: str) -> str:
        """The queue for ``task_name``: exact route, then glob routes, then the default."""
        routes = self.settings.task_routes
        if callable(routes):
            return routes(task_name) or self.settings.task_default_queue
        if task_name in routes:
            return routes[task_name]
        for pattern, queue in routes.items():
            if fnmatch.fnmatchcase(task_name, pattern):
                return queue
        return self.settings.task_default_queue

    def AsyncResult(self, task_id: str) -> _result.AsyncResult[Any]:
        return _result.AsyncResult(task_id, self)

    # -- sending ------------------------------------------------------------------------
    def send_task(
        self,
        name: str,
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
        ignore_result: bool = False,
    ) -> _result.AsyncResult[Any]:
        """Send a task by name; the task need not be importable here."""
        message, queue, delay = self._build(
            name, args, kwargs, countdown=countdown, eta=eta, expires=expires, queue=queue,
            priority=priority, task_id=task_id, headers=headers, serializer=serializer,
            retries=retries, time_limit=time_limit, soft_time_limit=soft_time_limit,
            ignore_result=ignore_result,
        )
        if self.hooks:
            self.hooks.call("before_publish", message, queue)
        self.publisher.publish(queue, message, delay=delay)
        if self.hooks:
            self.hooks.call("after_publish", message, queue)
        if self.settings.task_send_sent_event:
            self._send_sent_event(message, queue)
        return _result.AsyncResult(message.headers["id"], self, name)

    def send_many(
        self,
        name: str,
        calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]] | Sequence[Any]],
        *,
        queue: str | None = None,
        priority: int | None = None,
        countdown: float | None = None,
        serializer: str | None = None,
        chunk_size: int = 1000,
    ) -> list[_result.AsyncResult[Any]]:
        """Send task ``name`` once per call in ``calls``, ``chunk_size`` per broker round trip.

        Each call is an args sequence, or an ``(args, kwargs)`` pair. Every message is
        built (and serialized) before anything is sent, chunk by chunk: an argument that
        cannot be encoded raises before that chunk is published.
        """
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size!r}")
        results: list[_result.AsyncResult[Any]] = []
        chunk: list[Outgoing] = []
        for call in calls:
            args, kwargs = _split_call(call)
            message, q, delay = self._build(
                name, args, kwargs, countdown=countdown, eta=None, expires=None, queue=queue,
                priority=priority, task_id=None, headers=None, serializer=serializer,
                retries=0, time_limit=None, soft_time_limit=None, ignore_result=False,
            )
            chunk.append(Outgoing(q, message, delay))
            results.append(_result.AsyncResult(message.headers["id"], self, name))
            if len(chunk) >= chunk_size:
                self._publish_chunk(chunk)
                chunk = []
        if chunk:
            self._publish_chunk(chunk)
        return results

    def _publish_chunk(self, chunk: list[Outgoing]) -> None:
        if self.hooks:
            for item in chunk:
                self.hooks.call("before_publish", item.message, item.queue)
        self.publisher.publish_many(chunk)
        if self.hooks:
            for item in chunk:
                self.hooks.call("after_publish", item.message, item.queue)
        if self.settings.task_send_sent_event:
            for item in chunk:
                self._send_sent_event(item.message, item.queue)

    def _send_sent_event(self, message: Message, queue: str) -> None:
        h = message.headers
        fields: dict[str, Any] = {}
        if not self.settings.events_hide_args:
            fields["args"], fields["kwargs"] = h.get("argsrepr"), h.get("kwargsrepr")
        self.events.send("task-sent", uuid=h["id"], name=h["task"], retries=h.get("retries"),
                         eta=h.get("eta"), expires=h.get("expires"), queue=queue,
                         root_id=h.get("root_id"), parent_id=h.get("parent_id"), **fields)

    async def asend_task(self, name: str, args: Sequence[Any] | None = None,
                         kwargs: Mapping[str, Any] | None = None, **options: Any
                         ) -> _result.AsyncResult[Any]:
        return await asyncio.to_thread(self.send_task, name, args, kwargs, **options)

    def _build(
        self, name: str, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None, *,
        countdown: float | None, eta: datetime | None,
        expires: float | timedelta | datetime | None, queue: str | None,
        priority: int | None, task_id: str | None, headers: Mapping[str, Any] | None,
        serializer: str | None, retries: int, time_limit: float | None,
        soft_time_limit: float | None, ignore_result: bool,
    ) -> tuple[Message, str, float | None]:
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        # Exact types first: the ABC checks cost a microsecond each, on every message.
        if args is not None and type(args) not in (tuple, list) and (
                isinstance(args, (str, bytes)) or not isinstance(args, Sequence)):
            raise TypeError(f"args must be a list or tuple, got {type(args).__name__}")
        if kwargs is not None and type(kwargs) is not dict and not isinstance(kwargs, Mapping):
            raise TypeError(f"kwargs must be a mapping, got {type(kwargs).__name__}")
        if priority is not None:
            _validate_priority(priority)
        if countdown is not None and eta is not None:
            raise ValueError("give countdown or eta, not both")
        args, kwargs = list(args or ()), dict(kwargs or {})
        task_id = task_id or new_id()
        now = utcnow()
        if countdown is not None:
            if not isinstance(countdown, (int, float)):
                raise TypeError(f"countdown must be a number of seconds, got {countdown!r}")
            eta = now + timedelta(seconds=countdown) if countdown > 0 else None
        if eta is not None and eta.tzinfo is None:
            eta = eta.replace(tzinfo=UTC)
        delay = (eta - now).total_seconds() if eta is not None else None
        serializer = serializer or self.settings.task_serializer
        content_type, body = _encode_body(name, args, kwargs, serializer)
        a_repr, k_repr = args_repr(args, kwargs)
        h = task_headers(
            task=name, task_id=task_id, args_repr=a_repr, kwargs_repr=k_repr, eta=eta,
            expires=_absolute(expires, now), retries=retries, time_limit=time_limit,
            soft_time_limit=soft_time_limit, ignore_result=ignore_result,
            extra=dict(headers) if headers else None,
        )
        if priority is None:
            priority = self.settings.task_default_priority
        message = Message(h, body, content_type, "utf-8", task_properties(task_id, priority))
        return message, queue or self.route(name), delay

    # -- worker ---------------------------------------------------------------------------
    def worker(self, **options: Any) -> Worker:
        from .worker import Worker

        return Worker(self, **options)


def _split_call(call: Any) -> tuple[Sequence[Any], Mapping[str, Any] | None]:
    if (isinstance(call, tuple) and len(call) == 2 and isinstance(call[1], Mapping)
            and isinstance(call[0], (list, tuple))):
        return call[0], call[1]
    if isinstance(call, (list, tuple)):
        return call, None
    raise TypeError(f"each call must be an args sequence or (args, kwargs), got {call!r}")


def _validate_priority(priority: Any) -> None:
    if priority is not None and (not isinstance(priority, int) or not 0 <= priority <= 9):
        raise ValueError(f"priority must be an int from 0 to 9, got {priority!r}")


def _absolute(expires: float | timedelta | datetime | None, now: datetime) -> datetime | None:
    if expires is None:
        return None
    if isinstance(expires, datetime):
        return expires if expires.tzinfo else expires.replace(tzinfo=UTC)
    if isinstance(expires, timedelta):
        return now + expires
    if isinstance(expires, (int, float)):
        return now + timedelta(seconds=expires)
    raise TypeError(f"expires must be seconds, a timedelta or a datetime, got {expires!r}")


def _encode_body(name: str, args: list[Any], kwargs: dict[str, Any], serializer: str
                 ) -> tuple[str, bytes]:
    try:
        return serialization.dumps((args, kwargs, _EMBED), serializer)
    except EncodeError:
        pass
    # Find the culprit so the message names the argument, not just the type.
    for label, value in [*((f"argument {i}", a) for i, a in enumerate(args)),
                         *((f"keyword argument {k!r}", v) for k, v in kwargs.items())]:
        try:
            serialization.dumps(value, serializer)
        except EncodeError as exc:
            raise EncodeError(
                f"cannot send {name}: {label} has type {type(value).__name__}, which the "
                f"{serializer!r} serializer cannot encode ({exc.__cause__}); nothing was published"
            ) from exc
    raise EncodeError(f"cannot send {name}: arguments cannot be encoded with {serializer!r}")


_EMBED: dict[str, Any] = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
