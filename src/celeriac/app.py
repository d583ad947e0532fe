"""``Celeriac``: the application object that registers tasks and sends them."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import fields
from datetime import datetime, timedelta
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Literal,
    ParamSpec,
    TypeVar,
    overload,
)

from . import producer, serialization, signals
from . import result as _result
from .backends.base import ResultBackend, create_backend
from .canvas import Signature, register_builtins
from .canvas import signature as _signature
from .errors import ConfigurationError
from .fixups import django as _django_fixup
from .hooks import HookRunner, Hooks
from .producer import SendOptions, validate_priority
from .producer import flow as _flow
from .producer import outbox as _outbox
from .runtime import state as _state
from .serialization import compression as _compression
from .settings import Conf, Settings, config
from .settings.loading import django_apps, load_object
from .settings.rates import parse_rate
from .settings.routing import Routing
from .tasks import Task, TaskOptions
from .transports.base import Outgoing, Publisher, Transport, create_transport

if TYPE_CHECKING:
    from .control import Control
    from .events import EventDispatcher
    from .worker import Worker

P = ParamSpec("P")
R = TypeVar("R")

logger = logging.getLogger("celeriac.app")

_connecting = threading.RLock()
"""Held while an app makes a connection: two threads asking first at once (a test's
``get()``, the solo pool's first task) must not each make one, the loser left unclosed."""


def _new_lock() -> None:  # a forked child's own: another thread may have held the parent's
    global _connecting
    _connecting = threading.RLock()


os.register_at_fork(after_in_child=_new_lock)


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
        include: Sequence[str] | None = None,
        settings: Settings | None = None,
        config_source: object | str | None = None,
        namespace: str | None = None,
        task_cls: type[Task[Any, Any]] | None = None,
        set_as_current: bool = True,
        **overrides: Any,
    ) -> None:
        self.main = main
        base = settings or Settings()
        if config_source is not None:
            base = base.update_from(load_object(config_source), namespace)
        if broker is not None:
            overrides["broker_url"] = broker
        if backend is not None:
            overrides["result_backend"] = backend
        if include is not None:
            overrides["include"] = config.module_names(include, "include")
        self.settings = base.replace(**overrides) if overrides else base
        self.tasks: dict[str, Task[Any, Any]] = {}
        self.Task: type[Task[Any, Any]] = task_cls or Task
        """The class of this app's tasks (``@app.task(base=...)`` picks another)."""
        self.hooks = HookRunner()
        self._finalized = False
        self._autodiscover: list[tuple[Any, str]] = []
        self._routers: Routing | None = None
        self._transport: Transport | None = None
        self._relay: Publisher | None = None
        """In a pool child whose broker lives in the worker's memory: where it publishes."""
        self._backend: ResultBackend | None = None
        self._events: EventDispatcher | None = None
        self._periodic: dict[str, Any] = {}
        """``add_periodic_task``'s entries (``celeriac.beat``), by name."""
        self._control: Control | None = None
        self._pid = os.getpid()
        signals.install(self)
        register_builtins(self)  # celery.map, celery.starmap: what canvas messages name
        _state.register_app(self, set_as_current)

    def __repr__(self) -> str:
        return f"<Celeriac {self.main or '__main__'} broker={self.settings.broker_url}>"

    @property
    def conf(self) -> Conf:
        """The settings as Celery shows them: ``app.conf.task_serializer``,
        ``app.conf.update(...)``, ``app.conf.x = y`` (``configure`` says when a change
        takes effect)."""
        return Conf(self)

    def configure(self, **changes: Any) -> None:
        """Change settings (validated at once; an error names the setting).

        Before the app is finalized, anything. After, as Celery allows: what this process
        reads per call takes effect at once (``delay()``/``apply_async`` options,
        routing, serializers, eager mode, the canvas's flags, and an in-process worker's
        per-message reads); ``include``/``imports`` added are imported now. Not re-read:
        what the connections were made with (``broker_url``, ``result_backend`` and
        their transport options: changing them once the app has connected is an error),
        and what a running worker fixed at its start (concurrency, queues, prefetch,
        time limits of its pool's children, events); a worker in another process keeps
        the settings it started with (docs/guide/configuration.md)."""
        self._swap(self.settings.replace(**changes), "configure()")

    def config_from_object(self, obj: object | str, namespace: str | None = None,
                           force: bool = True) -> None:
        """Read settings from a module (or ``"module:attribute"``), an object or a mapping,
        as Celery does; ``namespace="CELERY"`` reads Django's ``CELERY_BROKER_URL`` and so
        on. Settings not named there keep their values. After finalize: as ``configure``."""
        self._swap(self.settings.update_from(load_object(obj), namespace),
                   "config_from_object()")

    def setup_security(self, allowed_serializers: Any = None, key: str | None = None,
                       key_password: str | None = None, cert: str | None = None,
                       store: str | None = None, digest: str | None = None,
                       serializer: str = "json") -> None:
        """Celery's: sign task messages with the ``auth`` serializer
        (``celeriac.serialization.signing``), from the ``security_*`` settings or these
        arguments; needs ``task_serializer="auth"`` and ``accept_content=["auth"]``.
        ``allowed_serializers`` is accepted for Celery's signature: only
        ``accept_content`` is ever decoded here."""
        from .serialization import signing  # deferred: only signing apps need it

        s = self.settings
        signing.setup_security(
            task_serializer=s.task_serializer, accept_content=s.accept_content,
            key=key or s.security_key, key_password=key_password or s.security_key_password,
            cert=cert or s.security_certificate, store=store or s.security_cert_store,
            digest=digest or s.security_digest, hmac_secrets=s.security_hmac_keys,
            serializer=serializer)

    def _swap(self, new: Settings, what: str) -> None:
        old = self.settings
        if self._finalized:
            connected = self._transport is not None or self._backend is not None
            fixed = [name for name in _CONNECTION_SETTINGS
                     if getattr(new, name) != getattr(old, name)]
            if connected and fixed:
                raise ConfigurationError(
                    f"{what}: {', '.join(sorted(fixed))} cannot change once the app has "
                    "connected (its connections were made with the old value); set it "
                    "before, or close() the app first")
            added = [m for m in (*new.imports, *new.include)
                     if m not in (*old.imports, *old.include)]
            self.settings = new
            for module in added:
                importlib.import_module(module)
            return
        self.settings = new

    @property
    def finalized(self) -> bool:
        return self._finalized

    def finalize(self) -> None:
        """Import the modules of ``include``/``imports`` and of ``autodiscover_tasks``,
        apply ``task_annotations``, and freeze the settings. The worker does this at
        start; connecting to the broker or backend does it too."""
        if self._finalized:
            return
        self._finalized = True
        try:
            if os.environ.get("DJANGO_SETTINGS_MODULE"):
                # Celery's Django fixup: django.setup() before any task module imports a
                # model.
                _django_fixup.fixup(self)
            for module in (*self.settings.imports, *self.settings.include):
                importlib.import_module(module)
            for packages, related_name in self._autodiscover:
                self._discover(packages, related_name)
            for task in list(self.tasks.values()):
                self._annotate(task)
        except BaseException:
            self._finalized = False
            raise

    def autodiscover_tasks(self, packages: Iterable[str] | Callable[[], Iterable[str]]
                           | None = None, related_name: str = "tasks",
                           force: bool = False) -> None:
        """Import ``<package>.tasks`` for each package when the app is finalized (now with
        ``force``). ``packages`` may be a function returning them (Django's
        ``lambda: settings.INSTALLED_APPS``); None: Django's installed apps."""
        if force or self._finalized:
            self._discover(packages, related_name)
        else:
            self._autodiscover.append((packages, related_name))

    def _discover(self, packages: Any, related_name: str) -> None:
        if packages is None:
            packages = django_apps()
        elif callable(packages):
            packages = packages()
        for package in packages:
            name = f"{package}.{related_name}" if related_name else package
            try:
                importlib.import_module(name)
            except ModuleNotFoundError as exc:
                parent = package.rpartition(".")[0]
                if related_name and parent and exc.name == package:
                    # Not a package (Django's "app.apps.AppConfig"): its parent's, as Celery.
                    self._discover([parent], related_name)
                    continue
                if exc.name != name:
                    raise  # the tasks module exists but imports something missing
                logger.debug("autodiscover: %s has no %s module", package, related_name)

    def set_current(self) -> None:
        """Make this the app ``shared_task`` proxies and ``current_app()`` use."""
        _state.set_current(self)

    def set_default(self) -> None:
        """Celery's ``app.set_default()``: the same as ``set_current()`` here, where the
        current app is also the one used when none was set."""
        _state.set_current(self)

    # -- connections (per process: a forked child opens its own) -----------------------
    @property
    def transport(self) -> Transport:
        transport = self._transport
        if transport is None or self._pid != os.getpid():
            transport = self._connect("_transport", lambda: create_transport(
                self.settings.broker_url, self.settings))
        return transport

    def _connect(self, attribute: str, make: Callable[[], Any]) -> Any:
        """The connection kept in ``attribute``, made once per process: under a lock, so
        that two threads asking first do not each make one (the loser's left unclosed)."""
        self.finalize()
        with _connecting:
            self._reset_after_fork()
            if getattr(self, attribute) is None:
                setattr(self, attribute, make())
            return getattr(self, attribute)

    @property
    def publisher(self) -> Publisher:
        """Where ``send_task`` publishes: the transport, or a pool child's relay."""
        if self._relay is not None and self._pid == os.getpid():
            return self._relay
        return self.transport

    @property
    def backend(self) -> ResultBackend:
        backend = self._backend
        if backend is None or self._pid != os.getpid():
            backend = self._connect("_backend", lambda: create_backend(
                self.settings.backend_url, self.settings))
        return backend

    @property
    def events(self) -> EventDispatcher:
        """This process's dispatcher of producer events (``task-sent``)."""
        events = self._events
        if events is None or self._pid != os.getpid():
            from .events import EventDispatcher  # deferred: see _lazy_services

            with _connecting:
                self._reset_after_fork()
                events = self._events = self._events or EventDispatcher(self, groups=("task",))
        return events

    @property
    def control(self) -> Control:
        """Remote control of the workers (Celery's ``app.control``): ``inspect()``,
        ``ping()``, ``revoke()``, ``rate_limit()``, ``broadcast()``..."""
        control = self._control
        if control is None:
            from .control import Control  # deferred: see _lazy_services

            with _connecting:
                control = self._control = self._control or Control(self)
        return control

    def _reset_after_fork(self) -> None:
        if self._pid != os.getpid():
            # The parent's connections belong to the parent: drop, never close, them.
            self._transport = self._backend = self._events = self._relay = None
            self._pid = os.getpid()

    def adopt_fork(self, *, publisher: Publisher | None = None,
                   backend: ResultBackend | None = None) -> tuple[object, ...]:
        """Make the app this forked process's own (a prefork pool child calls it at start).

        The broker and backend connections inherited from the parent are dropped and
        returned, never closed: the caller keeps them alive, since closing an inherited
        socket or SQLite handle here could disturb the parent's use of it; this process
        opens its own when it first needs one. ``publisher`` and ``backend`` stand in
        where given: a child's relays through its pipe to a broker or result backend that
        lives in the worker's memory. It exists so that the app's connections are set by
        the app alone, not written from the pool's modules.
        """
        inherited = (self._transport, self._backend)
        self._transport = None
        self._relay, self._backend = publisher, backend
        self._pid = os.getpid()
        return inherited

    def close(self) -> None:
        if self._control is not None:
            self._control.close()
        if self._events is not None:
            self._events.close()
            self._events = None
        if self._transport is not None:
            self._transport.close()
        if self._backend is not None:
            self._backend.close()
        self._transport = self._backend = None
        _flow.close(self)

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
        serializer: str | None = ..., compression: str | None = ...,
        track_started: bool | None = ...,
        rate_limit: str | float | None = ..., global_rate_limit: str | float | None = ...,
        unique_for: float | None = ..., unique_key: Callable[[Any, Any], Any] | None = ...,
        unique_mode: str = ..., concurrency: int | None = ...,
        concurrency_key: Callable[[Any, Any], Any] | None = ...,
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
        serializer: str | None = ..., compression: str | None = ...,
        track_started: bool | None = ...,
        rate_limit: str | float | None = ..., global_rate_limit: str | float | None = ...,
        unique_for: float | None = ..., unique_key: Callable[[Any, Any], Any] | None = ...,
        unique_mode: str = ..., concurrency: int | None = ...,
        concurrency_key: Callable[[Any, Any], Any] | None = ...,
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    def task(self, fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
        """Register a function as a task: ``@app.task`` or ``@app.task(bind=True, ...)``."""
        if fn is not None:
            return self._register(fn, options)

        def decorator(f: Callable[..., Any]) -> Task[Any, Any]:
            return self._register(f, options)

        return decorator

    def register_task(self, task: type[Task[Any, Any]] | Task[Any, Any]) -> Task[Any, Any]:
        """Celery's ``app.register_task``: a class-based task, ``class T(Task)`` with a
        ``run(self, ...)`` method (named by its ``name`` attribute, else module and class
        name), becomes a task of this app, bound (``run``'s ``self`` is the task); so does
        an instance of one made bare (``T()``, of the current app: itself); a task of
        another app is registered here as a copy bound to this one."""
        if isinstance(task, Task):
            if task.app is self:
                self.tasks[task.name] = task
                return task
            copy: Task[Any, Any] = type(task)(self, task.fn, task.options)
            self.tasks[copy.name] = copy
            return copy
        run = getattr(task, "run", None)
        if not (isinstance(task, type) and issubclass(task, Task) and callable(run)):
            raise TypeError(f"register_task needs a Task, or a Task subclass with a run() "
                            f"method, got {task!r}")
        name = getattr(task, "name", None)
        if not isinstance(name, str):
            name = f"{task.__module__}.{task.__qualname__}"
        return self._register(run, {"base": task, "name": name, "bind": True})

    def _register(self, fn: Callable[..., Any], options: dict[str, Any]) -> Task[Any, Any]:
        if not callable(fn):
            raise TypeError(f"@app.task needs a function, got {type(fn).__name__}")
        base = options.pop("base", None) or self.Task
        if not (isinstance(base, type) and issubclass(base, Task)):
            raise TypeError(f"@app.task(base=...) must be a subclass of celeriac.Task, got "
                            f"{base!r}")
        name = options.pop("name", None) or self._default_name(fn)
        unknown = options.keys() - TASK_OPTIONS
        if unknown:
            raise TypeError(
                f"@app.task({name!r}) got an unexpected keyword argument "
                f"{', '.join(repr(u) for u in sorted(unknown))}; task options: "
                f"{', '.join(sorted(TASK_OPTIONS))}, base")
        # A base class's attributes are defaults (Celery's Task subclasses).
        for option in TASK_OPTIONS - options.keys():
            value = _class_default(base, option)
            if value is not _MISSING:
                options[option] = value
        task_options = _task_options(name, options)
        task: Task[Any, Any] = base(self, fn, task_options)
        if name in self.tasks and self.tasks[name].fn is not fn:
            logger.warning("task %s registered twice; the later definition wins", name)
        self.tasks[name] = task
        if self._finalized:
            self._annotate(task)
        return task

    def _annotate(self, task: Task[Any, Any]) -> None:
        """Apply ``task_annotations`` over the task's own options (Celery's order)."""
        found = self.settings.task_annotations
        if found is None:
            return
        changes: dict[str, Any] = {}
        for annotate in config.annotators(found):
            changes.update(annotate(task.name))
        if changes:
            task.options = _task_options(task.name, {
                **{f.name: getattr(task.options, f.name) for f in fields(TaskOptions)
                   if f.name != "name"}, **changes})

    def _default_name(self, fn: Callable[..., Any]) -> str:
        module = fn.__module__
        if module == "__main__" and self.main:
            module = self.main
        return f"{module}.{fn.__qualname__}"

    def route(self, task_name: str) -> str:
        """The queue for ``task_name``: the first router of ``task_routes`` that names
        one (in a dict: the exact name, then glob patterns), else the default queue."""
        settings = self.settings
        if not settings.task_routes and not settings.task_default_routing_key:
            return settings.task_default_queue  # the common case, on every send
        return self.routing.route(task_name)

    @property
    def default_queues(self) -> list[str]:
        """The queues a worker started without ``-Q`` consumes: those of ``task_queues``,
        else ``task_default_queue`` (Celery's rule)."""
        return self.routing.default_queues

    def queue_for_key(self, routing_key: str) -> str:
        """The queue a ``routing_key`` reaches: the one ``task_queues`` binds by it, else
        the queue of that name."""
        return self.routing.queue_for_key(routing_key)

    @property
    def routing(self) -> Routing:
        """Where messages go (``task_routes``, ``task_queues``), for the current settings."""
        cached = self._routers
        if cached is None or cached.settings is not self.settings:
            cached = self._routers = Routing(self.settings)
        return cached

    def AsyncResult(self, task_id: str) -> _result.AsyncResult[Any]:
        return _result.AsyncResult(task_id, self)

    def signature(self, task: str | Mapping[str, Any], args: Sequence[Any] | None = None,
                  kwargs: Mapping[str, Any] | None = None, **options: Any) -> Signature:
        """A signature of task ``task`` (a name; the task need not be importable here), or
        one rebuilt from a signature dict, bound to this app."""
        if isinstance(task, Mapping):
            return _signature(task, app=self)
        return Signature(task, args, kwargs, app=self, **options)

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
        shadow: str | None = None,
        routing_key: str | None = None,
        exchange: str | None = None,
        retry: bool | None = None,
        retry_policy: Mapping[str, Any] | None = None,
        parent_id: str | None = None,
        root_id: str | None = None,
        group_id: str | None = None,
        add_to_parent: bool = True,
        link: Any = None,
        link_error: Any = None,
        compression: str | None = None,
        argsrepr: str | None = None,
        kwargsrepr: str | None = None,
    ) -> _result.AsyncResult[Any]:
        """Send a task by name; the task need not be importable here.

        Takes Celery's ``apply_async`` options. ``routing_key`` names the queue when
        ``queue`` is not given (the default exchange routes by queue name); ``retry`` and
        ``retry_policy`` (``max_retries``) govern this publish's reconnection attempts;
        ``shadow`` is the name logs and events show; ``link`` and ``link_error`` (a
        signature or a list of them) run after the task, with its result or its failure;
        ``compression`` (``"gzip"``, ``"bzip2"``, ``"lzma"``) overrides
        ``task_compression``; ``argsrepr``/``kwargsrepr`` are what logs and monitors show
        of the arguments (the headers' default: their repr)."""
        embed = None
        if link is not None or link_error is not None:
            embed = {"callbacks": self._linked(link, "link"),
                     "errbacks": self._linked(link_error, "link_error")}
        options = SendOptions(
            countdown=countdown, eta=eta, expires=expires, queue=queue,
            routing_key=routing_key, exchange=exchange, priority=priority, task_id=task_id,
            headers=headers, serializer=serializer, compression=compression,
            retries=retries, time_limit=time_limit, soft_time_limit=soft_time_limit,
            ignore_result=ignore_result, shadow=shadow, parent_id=parent_id,
            root_id=root_id, group_id=group_id, add_to_parent=add_to_parent, retry=retry,
            retry_policy=retry_policy, argsrepr=argsrepr, kwargsrepr=kwargsrepr,
            embed=embed).check()
        return producer.send(self, name, args, kwargs, options)

    def _linked(self, value: Any, option: str) -> list[dict[str, Any]] | None:
        """``link=``/``link_error=`` as the signature dicts the message carries."""
        if value is None:
            return None
        items = value if isinstance(value, (list, tuple)) else [value]
        try:
            return [dict(self.signature(item)) for item in items]
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"{option}= must be a signature or a list of them: "
                                     f"{exc}") from None

    def send_many(
        self,
        name: str,
        calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]] | Sequence[Any]],
        *,
        queue: str | None = None,
        priority: int | None = None,
        countdown: float | None = None,
        serializer: str | None = None,
        compression: str | None = None,
        chunk_size: int = 1000,
        fair_key: str | None = None,
    ) -> list[_result.AsyncResult[Any]]:
        """Send task ``name`` once per call in ``calls``, ``chunk_size`` per broker round trip.

        Each call is an args sequence, or an ``(args, kwargs)`` pair. Every message is
        built (and serialized) before anything is sent, chunk by chunk: an argument that
        cannot be encoded raises before that chunk is published.
        """
        options = SendOptions(queue=queue, priority=priority, countdown=countdown,
                              serializer=serializer, compression=compression,
                              add_to_parent=False, fair_key=fair_key).check()
        return producer.send_many(self, name, calls, options, chunk_size)

    def publish_prepared(self, items: Iterable[Outgoing], *, chunk_size: int = 1000,
                         retry: bool | None = None,
                         retry_policy: Mapping[str, Any] | None = None) -> int:
        """Publish messages made by ``producer.prepare``, ``chunk_size`` per broker
        round trip (hooks and ``task-sent`` events as ``send_task``); returns how many."""
        return producer.publish_prepared(self, items, chunk_size=chunk_size, retry=retry,
                                         retry_policy=retry_policy)

    def transaction(self, conn: Any = None, *, using: str | None = None
                    ) -> contextlib.AbstractContextManager[Any]:
        """``with app.transaction(conn):``: every message this app sends in the block
        (``delay()``, ``apply_async()``, ``send_task()``, canvas) is written to the
        outbox table in the block's PostgreSQL transaction, and a relay publishes it
        once it committed (``celeriac outbox relay``, ``worker_outbox``). ``conn``: a
        psycopg 3 connection, Django's connection (or ``using="alias"``), an SQLAlchemy
        ``Session`` or ``Connection``; the block is a transaction of it (a savepoint in
        one already open) and an exception rolls it back, messages included
        (docs/guide/outbox.md)."""
        return _outbox.transaction(self, conn, using=using)

    async def asend_task(self, name: str, args: Sequence[Any] | None = None,
                         kwargs: Mapping[str, Any] | None = None, **options: Any
                         ) -> _result.AsyncResult[Any]:
        import asyncio  # deferred: ~20 ms (ssl, subprocess); an awaiting caller has it

        return await asyncio.to_thread(self.send_task, name, args, kwargs, **options)

    # -- periodic tasks (celeriac.beat) ---------------------------------------------------
    def add_periodic_task(self, schedule: Any, sig: Any, args: Sequence[Any] = (),
                          kwargs: Mapping[str, Any] | None = None, name: str | None = None,
                          **options: Any) -> str:
        """Celery's ``add_periodic_task``: run ``sig`` (a signature, a task or a task
        name, with ``args``/``kwargs``) on ``schedule``; returns the entry's name."""
        from .beat.entries import from_periodic  # deferred: see _lazy_services

        entry = from_periodic(schedule, sig, args, kwargs, name, options)
        self._periodic[entry.name] = entry
        return entry.name

    @property
    def beat(self) -> Any:
        """``celeriac.beat.BeatAPI``: list, add, remove, enable, disable, run entries in
        the shared store, at runtime."""
        from .beat.api import api_for  # deferred: see _lazy_services

        return api_for(self)

    # -- worker ---------------------------------------------------------------------------
    def worker(self, **options: Any) -> Worker:
        from .worker import Worker  # deferred: see _lazy_services

        return Worker(self, **options)


_CONNECTION_SETTINGS = ("broker_url", "result_backend", "broker_transport_options",
                        "result_backend_transport_options")
"""What the app's connections are made with: fixed once it has connected."""
TASK_OPTIONS = frozenset(f.name for f in fields(TaskOptions)) - {"name"}
_MISSING: Any = object()


def _class_default(base: type[Task[Any, Any]], option: str) -> Any:
    return base.option_defaults.get(option, _MISSING)


def _task_options(name: str, options: dict[str, Any]) -> TaskOptions:
    validate_priority(options.get("priority"))
    if options.get("serializer") is not None:
        serialization.get_serializer(options["serializer"])
    if options.get("compression") is not None:
        try:
            _compression.content_type(options["compression"])
        except ConfigurationError as exc:
            raise ConfigurationError(f"task {name!r}: compression: {exc}") from None
    for option in ("rate_limit", "global_rate_limit"):
        if options.get(option) is not None:
            try:
                parse_rate(options[option])
            except ValueError as exc:
                raise ConfigurationError(f"task {name!r}: {option}: {exc}") from None
    _flow.check_options(name, options)
    autoretry = options.get("autoretry_for")
    if isinstance(autoretry, list):
        options["autoretry_for"] = tuple(autoretry)
    return TaskOptions(name=name, **options)


# ``current_app`` with no app made yet makes this one; registered from here, above it.
_state.set_default_app(Celeriac)

_lazy_services = None
"""Why the facade imports the services (worker, beat, control, events) inside the methods
that reach them, though they sit below it in the layers: a producer (``import celeriac``,
``task.delay()``) never uses them, and importing them costs about a third of
``import celeriac``'s time. These are the only function-level imports of celeriac's own
modules kept for that reason."""
