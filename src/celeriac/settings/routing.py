"""Where messages go: Celery's ``task_routes`` and ``task_queues``, read once per
``Settings`` into a ``Routing``.

- ``task_routes``: a dict of task name (or ``fnmatch`` glob) to a queue name or to
  ``{"queue": ...}`` / ``{"routing_key": ..., "exchange": ...}``, a router function (of
  the task name, or Celery's ``(name, args, kwargs, options, task=None, **kw)``), or a
  list of those, tried in order (``routers``).
- ``task_queues``: kombu ``Queue`` objects (read by attribute: kombu need not be
  installed), queue names, or Celery's old ``CELERY_QUEUES`` dict (``declared_queues``).
  A routing key reaches the queue bound by it, as a direct exchange routes on RabbitMQ;
  what would route otherwise (topic, fanout, headers exchanges...) is refused.

There are no exchanges here: a message goes to one queue, by name.
"""

from __future__ import annotations

import fnmatch
import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import ConfigurationError

if TYPE_CHECKING:
    from . import Settings


class DeclaredQueue(NamedTuple):
    """A queue of ``task_queues``: its name, and the routing key that reaches it."""

    name: str
    routing_key: str
    exchange: str = ""
    """The direct exchange it is bound to ("": the default exchange)."""


QUEUE_ARGUMENTS = frozenset({"x-max-priority"})
"""kombu ``queue_arguments`` that change nothing here: priorities 0-9 work on every queue."""


def declared_queues(value: Any) -> tuple[DeclaredQueue, ...]:
    """``task_queues`` as Celery takes it: kombu ``Queue`` objects (read by attribute, so
    kombu need not be installed), queue names, or Celery's old ``CELERY_QUEUES`` dict of
    name -> ``{"exchange": ..., "exchange_type": ..., "routing_key": ...}``.

    Only what routes here as it does on RabbitMQ passes: a queue bound to a direct
    exchange (any name) by one routing key, no two queues by the same key (a direct
    exchange would copy the message into both). The rest raises ``ConfigurationError``
    naming the queue."""
    if value is None:
        return ()
    if isinstance(value, Mapping):
        items: list[Any] = [_queue_from_dict(name, options) for name, options in value.items()]
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
    else:
        raise ConfigurationError(f"task_queues: expected a list of queues, got "
                                 f"{type(value).__name__}")
    out: dict[str, DeclaredQueue] = {}
    by_key: dict[str, str] = {}
    for item in items:
        queue = item if isinstance(item, DeclaredQueue) else _declared(item)
        if queue.name in out:
            raise ConfigurationError(f"task_queues: queue {queue.name!r} is declared twice")
        if queue.routing_key in by_key:
            raise ConfigurationError(
                f"task_queues: queues {by_key[queue.routing_key]!r} and {queue.name!r} are "
                f"bound by the same routing key {queue.routing_key!r}: a message goes to "
                "one queue here")
        out[queue.name], by_key[queue.routing_key] = queue, queue.name
    return tuple(out.values())


def _declared(item: Any) -> DeclaredQueue:
    if isinstance(item, str):
        if not item:
            raise ConfigurationError("task_queues: a queue name is empty")
        return DeclaredQueue(item, item)
    name = getattr(item, "name", None)
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"task_queues: expected a queue name or a kombu Queue, got "
                                 f"{item!r}")
    exchange = getattr(item, "exchange", None)
    _check_direct(name, getattr(exchange, "type", None))
    if getattr(item, "bindings", None):
        raise ConfigurationError(f"task_queues: queue {name!r} has several bindings; only "
                                 "one routing key per queue is supported")
    arguments = getattr(item, "queue_arguments", None) or {}
    unknown = sorted(set(arguments) - QUEUE_ARGUMENTS)
    if unknown:
        raise ConfigurationError(f"task_queues: queue {name!r}: queue_arguments {unknown} "
                                 "are not supported")
    return DeclaredQueue(name, getattr(item, "routing_key", None) or name,
                         getattr(exchange, "name", None) or "")


def _check_direct(queue: Any, kind: Any) -> None:
    if (kind or "direct") != "direct":
        raise ConfigurationError(
            f"task_queues: queue {queue!r} is bound to a {kind} exchange; only direct routing "
            "is supported (a route or routing_key names one queue)")


def _queue_from_dict(name: Any, options: Any) -> DeclaredQueue:
    if options is not None and not isinstance(options, Mapping):
        return _declared(options)  # {name: Queue(...)}
    options = options or {}
    _check_direct(name, options.get("exchange_type"))
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"task_queues: a queue name must be a string, got {name!r}")
    # Celery's old form names the key binding_key (routing_key, its alias, wins).
    return DeclaredQueue(name, options.get("routing_key") or options.get("binding_key") or name,
                         options.get("exchange") or "")


Router = Callable[[str], "str | None"]


def routers(value: Any, routing: Routing) -> tuple[Router, ...]:
    """``task_routes`` as Celery takes it (a dict, a router function, or a list of those,
    tried in order), turned into functions of the task name that return a queue. A
    route's ``routing_key`` names the queue ``routing`` binds by it; its ``exchange`` must
    be one ``routing`` allows."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    return tuple(_router(item, routing) for item in items)


def _router(item: Any, routing: Routing) -> Router:
    if isinstance(item, Mapping):
        table = {pattern: _route_queue(pattern, target, routing)
                 for pattern, target in item.items()}
        exact = {k: v for k, v in table.items() if not any(c in k for c in "*?[")}
        globs = [(k, v) for k, v in table.items() if k not in exact]

        def by_table(task: str) -> str | None:
            if task in exact:
                return exact[task]
            return next((q for pattern, q in globs if fnmatch.fnmatchcase(task, pattern)),
                        None)
        return by_table
    if callable(item):
        try:
            positional = [p for p in inspect.signature(item).parameters.values()
                          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        except (TypeError, ValueError):
            positional = []
        if len(positional) >= 4:
            # Celery's router signature: (name, args, kwargs, options, task=None, **kw).
            def celery_router(task: str) -> str | None:
                return _route_result(task, item(task, (), {}, {}), routing)
            return celery_router
        return lambda task: _route_result(task, item(task), routing)
    raise ConfigurationError(f"task_routes: expected a dict, a router function or a list "
                             f"of them, got {type(item).__name__}")


def _route_queue(pattern: Any, target: Any, routing: Routing) -> str:
    if not isinstance(pattern, str):
        raise ConfigurationError(f"task_routes: keys are task names or glob patterns, got "
                                 f"{pattern!r}")
    queue = _route_result(pattern, target, routing)
    if queue is None:
        raise ConfigurationError(f"task_routes[{pattern!r}]: no queue in {target!r}")
    return queue


def _route_result(task: str, target: Any, routing: Routing) -> str | None:
    if target is None or isinstance(target, str):
        return target or None
    if isinstance(target, Mapping):
        unknown = set(target) - {"queue", "routing_key", "exchange", "priority"}
        if unknown:
            raise ConfigurationError(f"task_routes for {task!r}: {sorted(unknown)} not "
                                     "supported (a route names a queue)")
        key = target.get("routing_key")
        queue = target.get("queue") or (routing.queue_for_key(key) if key else None)
        exchange = target.get("exchange")
        if not routing.allows(exchange, queue):
            raise ConfigurationError(f"task_routes for {task!r}: exchange {exchange!r} is "
                                     "not supported (messages go to the named queue)")
        return str(queue) if queue else None
    raise ConfigurationError(f"task_routes for {task!r}: expected a queue name or a dict "
                             f"with 'queue', got {target!r}")


class Routing:
    """What ``task_routes`` and ``task_queues`` make of one ``Settings``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.declared = declared_queues(settings.task_queues)
        self.by_key = {q.routing_key: q.name for q in self.declared}
        """routing key -> the declared queue bound by it."""
        self.exchanges = frozenset(q.exchange for q in self.declared if q.exchange)
        """The direct exchanges declared queues are bound to (``exchange=`` may name one)."""
        self.default = self._default_queue(settings)
        """Where a task no router names goes."""
        if settings.task_default_exchange:
            self.exchanges |= {settings.task_default_exchange}
        self.routers = routers(settings.task_routes or {}, self)

    def route(self, task_name: str) -> str:
        """The first router's queue for ``task_name``, else the default queue."""
        for router in self.routers:
            queue = router(task_name)
            if queue:
                return queue
        return self.default

    def allows(self, exchange: Any, queue: str | None) -> bool:
        """Whether ``exchange`` (a name, or a kombu ``Exchange``) routes as a queue name
        does here: none, the default one (``""``), ``queue``'s own name, or one a declared
        queue (or ``task_default_exchange``) is bound to."""
        name = getattr(exchange, "name", exchange)
        return name in (None, "") or name == queue or name in self.exchanges

    def check(self, queue: str) -> str:
        """``queue``, or ``ConfigurationError`` when ``task_create_missing_queues=False``
        and ``task_queues`` does not declare it (Celery's ``QueueNotFound``)."""
        if self.settings.task_create_missing_queues or not self.declared or \
                any(q.name == queue for q in self.declared):
            return queue
        raise ConfigurationError(
            f"queue {queue!r} is not declared in task_queues and "
            f"task_create_missing_queues is False (declared: "
            f"{', '.join(q.name for q in self.declared)})")

    def queue_for_key(self, routing_key: str) -> str:
        """The queue ``task_queues`` binds by ``routing_key``, else the queue of that name."""
        return self.by_key.get(routing_key, routing_key)

    def _default_queue(self, settings: Settings) -> str:
        # Celery sends an unrouted task to task_default_exchange with
        # task_default_routing_key: on RabbitMQ a key bound to nothing drops it, so a
        # declaration that would is refused here.
        key, exchange = settings.task_default_routing_key, settings.task_default_exchange
        if not self.declared:
            return settings.task_default_queue
        # A Queue declared without an exchange is bound to the default one (kombu's '').
        unbound = any(not q.exchange for q in self.declared)
        if exchange and exchange not in self.exchanges and not unbound:
            raise ConfigurationError(
                f"task_default_exchange={exchange!r}: no queue of task_queues is bound to it")
        if not key:
            return settings.task_default_queue
        if key not in self.by_key:
            raise ConfigurationError(
                f"task_default_routing_key={key!r}: no queue of task_queues is bound by it "
                "(unrouted tasks would reach no queue)")
        return self.by_key[key]

    @property
    def default_queues(self) -> list[str]:
        """What a worker without ``-Q`` consumes: ``task_queues``, else the default queue."""
        return [q.name for q in self.declared] or [self.settings.task_default_queue]
