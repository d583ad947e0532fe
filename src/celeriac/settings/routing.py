"""Where messages go: Celery's ``task_routes`` and ``task_queues``, read once per
``Settings`` into a ``Routing``.

- ``task_routes``: a dict of task name (or ``fnmatch`` glob) to a queue name or to
  ``{"queue": ...}`` / ``{"routing_key": ..., "exchange": ...}``, a router function (of
  the task name, or Celery's ``(name, args, kwargs, options, task=None, **kw)``), or a
  list of those, tried in order (``routers``).
- ``task_queues``: kombu ``Queue`` objects (read by attribute: kombu need not be
  installed), queue names, or Celery's old ``CELERY_QUEUES`` dict (``declared_queues``).
  Three exchange types route as they do on RabbitMQ:

  - **direct**: a routing key reaches the one queue bound by it;
  - **topic**: a routing key reaches every queue of that exchange whose binding pattern
    matches it (``*`` one word, ``#`` zero or more; ``topic_matches``), resolved here
    when the message is sent, so it works the same on every broker;
  - **fanout** (``kombu.common.Broadcast``): every worker consuming the queue gets its
    own copy. The queue's name is the group's (kombu's alias, which is the exchange's
    name); each worker consumes ``<group>.<hostname>`` (``fanout_queue``), which the
    transport binds to the group (``Transport.bind_fanout``).

  Headers exchanges are refused.

A send whose destination is not one queue gets a ``Route`` (a ``str``: its exchange's
name) holding the queues, or the fanout group; ``producer/publish.py`` expands it.
"""

from __future__ import annotations

import fnmatch
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import ConfigurationError

if TYPE_CHECKING:
    from . import Settings

EXCHANGE_TYPES = ("direct", "topic", "fanout")


class DeclaredQueue(NamedTuple):
    """A queue of ``task_queues``: its name, and the routing key that reaches it."""

    name: str
    routing_key: str
    """The binding key (direct), or pattern (topic); a fanout queue's is its name."""
    exchange: str = ""
    """The exchange it is bound to ("": the default exchange)."""
    kind: str = "direct"
    """The exchange's type: ``direct``, ``topic`` or ``fanout``."""


class Route(str):
    """A send's destination that is not one queue by name: the queues a topic
    exchange's bindings give for the message's routing key, or a fanout group. The text
    is the exchange's name (what hooks and the ``task-sent`` event show)."""

    __slots__ = ("fanout", "queues")
    queues: tuple[str, ...]
    fanout: bool

    def __new__(cls, exchange: str, queues: tuple[str, ...], *, fanout: bool = False
                ) -> Route:
        self = super().__new__(cls, exchange)
        self.queues, self.fanout = queues, fanout
        return self


def fanout_queue(group: str, hostname: str) -> str:
    """The queue one worker consumes a fanout group's copies from."""
    return f"{group}.{hostname}"


def direct_queue(hostname: str) -> str:
    """``worker_direct``'s queue of the worker ``hostname``."""
    return f"{hostname}.dq"


def topic_matches(pattern: str, routing_key: str) -> bool:
    """Whether a topic binding ``pattern`` matches ``routing_key`` as RabbitMQ decides:
    words split on ``.``, ``*`` is exactly one word, ``#`` zero or more."""
    return _words_match(tuple(pattern.split(".")), tuple(routing_key.split(".")))


@functools.lru_cache(maxsize=4096)
def _words_match(pattern: tuple[str, ...], key: tuple[str, ...]) -> bool:
    if not pattern:
        return not key
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return _words_match(rest, key) or (bool(key) and _words_match(pattern, key[1:]))
    return bool(key) and head in ("*", key[0]) and _words_match(rest, key[1:])


QUEUE_ARGUMENTS = frozenset({"x-max-priority"})
"""kombu ``queue_arguments`` that change nothing here: priorities 0-9 work on every queue."""


def declared_queues(value: Any, default_kind: str = "direct", default_exchange: str = ""
                    ) -> tuple[DeclaredQueue, ...]:
    """``task_queues`` as Celery takes it: kombu ``Queue`` objects (read by attribute, so
    kombu need not be installed), queue names, or Celery's old ``CELERY_QUEUES`` dict of
    name -> ``{"exchange": ..., "exchange_type": ..., "routing_key": ...}``. A queue
    declared without an exchange is bound to ``default_exchange`` of ``default_kind``
    (Celery's ``task_default_exchange`` and ``task_default_exchange_type``).

    Only what routes here as it does on RabbitMQ passes: direct queues bound by one
    routing key each, no two by the same key (a direct exchange would copy the message
    into both), topic queues by one pattern each, fanout queues. The rest raises
    ``ConfigurationError`` naming the queue."""
    if value is None:
        return ()
    defaults = (default_kind, default_exchange)
    if isinstance(value, Mapping):
        items: list[Any] = [_queue_from_dict(name, options, defaults)
                            for name, options in value.items()]
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
    else:
        raise ConfigurationError(f"task_queues: expected a list of queues, got "
                                 f"{type(value).__name__}")
    out: dict[str, DeclaredQueue] = {}
    by_key: dict[str, str] = {}
    for item in items:
        queue = item if isinstance(item, DeclaredQueue) else _declared(item, defaults)
        if queue.name in out:
            raise ConfigurationError(f"task_queues: queue {queue.name!r} is declared twice")
        if queue.kind == "direct":
            if queue.routing_key in by_key:
                raise ConfigurationError(
                    f"task_queues: queues {by_key[queue.routing_key]!r} and {queue.name!r} "
                    f"are bound by the same routing key {queue.routing_key!r}: a direct "
                    "exchange would copy each message into both; use a topic exchange")
            by_key[queue.routing_key] = queue.name
        out[queue.name] = queue
    return tuple(out.values())


def _declared(item: Any, defaults: tuple[str, str]) -> DeclaredQueue:
    if isinstance(item, str):
        if not item:
            raise ConfigurationError("task_queues: a queue name is empty")
        return _bound(item, None, None, defaults)
    name = getattr(item, "name", None)
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"task_queues: expected a queue name or a kombu Queue, got "
                                 f"{item!r}")
    exchange = getattr(item, "exchange", None)
    kind = getattr(exchange, "type", None)
    if kind == "fanout":
        # kombu's Broadcast names its queue bcast.<uuid> (one per process); the group is
        # the exchange, which is also its alias.
        name = getattr(exchange, "name", None) or getattr(item, "alias", None) or name
    if getattr(item, "bindings", None):
        raise ConfigurationError(f"task_queues: queue {name!r} has several bindings; only "
                                 "one routing key per queue is supported")
    arguments = getattr(item, "queue_arguments", None) or {}
    unknown = sorted(set(arguments) - QUEUE_ARGUMENTS)
    if unknown:
        raise ConfigurationError(f"task_queues: queue {name!r}: queue_arguments {unknown} "
                                 "are not supported")
    return _bound(name, getattr(exchange, "name", None), kind,
                  defaults, getattr(item, "routing_key", None))


def _bound(name: str, exchange: Any, kind: Any, defaults: tuple[str, str],
           routing_key: Any = None) -> DeclaredQueue:
    if not exchange:
        # Bound to the default exchange: Celery's task_default_exchange(_type).
        kind, exchange = defaults if kind in (None, "direct") else (kind, exchange)
    kind = kind or "direct"
    if kind not in EXCHANGE_TYPES:
        raise ConfigurationError(
            f"task_queues: queue {name!r} is bound to a {kind} exchange; direct, topic and "
            "fanout exchanges are supported")
    if kind == "fanout":
        group = exchange or name
        return DeclaredQueue(group, group, group, "fanout")
    if kind == "topic" and not exchange:
        raise ConfigurationError(f"task_queues: topic queue {name!r} needs an exchange name "
                                 "(its routes name it)")
    return DeclaredQueue(name, routing_key or name, exchange or "", kind)


def _queue_from_dict(name: Any, options: Any, defaults: tuple[str, str]) -> DeclaredQueue:
    if options is not None and not isinstance(options, Mapping):
        return _declared(options, defaults)  # {name: Queue(...)}
    options = options or {}
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"task_queues: a queue name must be a string, got {name!r}")
    # Celery's old form names the key binding_key (routing_key, its alias, wins).
    return _bound(name, options.get("exchange"), options.get("exchange_type"), defaults,
                  options.get("routing_key") or options.get("binding_key"))


Router = Callable[[str], "str | None"]


def routers(value: Any, routing: Routing) -> tuple[Router, ...]:
    """``task_routes`` as Celery takes it (a dict, a router function, or a list of those,
    tried in order), turned into functions of the task name that return a queue (or a
    ``Route``). A route's ``routing_key`` names the queues ``routing`` binds by it; its
    ``exchange`` must be one ``routing`` allows."""
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
        return routing.resolve(target, None, None) if target else None
    if isinstance(target, Mapping):
        unknown = set(target) - {"queue", "routing_key", "exchange", "priority"}
        if unknown:
            raise ConfigurationError(f"task_routes for {task!r}: {sorted(unknown)} not "
                                     "supported (a route names a queue or an exchange)")
        queue, exchange = target.get("queue"), target.get("exchange")
        if not routing.allows(exchange, queue):
            raise ConfigurationError(f"task_routes for {task!r}: exchange {exchange!r} is "
                                     "not supported (task_queues binds no queue to it)")
        return routing.resolve(queue, exchange, target.get("routing_key"))
    raise ConfigurationError(f"task_routes for {task!r}: expected a queue name or a dict "
                             f"with 'queue', got {target!r}")


class Routing:
    """What ``task_routes`` and ``task_queues`` make of one ``Settings``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        kind = settings.task_default_exchange_type
        if kind not in ("direct", "topic"):
            raise ConfigurationError(f"task_default_exchange_type must be 'direct' or "
                                     f"'topic', got {kind!r}")
        default_exchange = "" if kind == "direct" else (
            settings.task_default_exchange or settings.task_default_queue)
        self.declared = declared_queues(settings.task_queues, kind, default_exchange)
        self.by_key = {q.routing_key: q.name for q in self.declared if q.kind == "direct"}
        """routing key -> the direct queue bound by it."""
        self.fanout = frozenset(q.name for q in self.declared if q.kind == "fanout")
        """The fanout groups (a ``Broadcast``'s name: its exchange's)."""
        self.topics: dict[str, list[DeclaredQueue]] = {}
        """topic exchange -> the queues bound to it."""
        for q in self.declared:
            if q.kind == "topic":
                self.topics.setdefault(q.exchange, []).append(q)
        self.topic_of = {q.name: q.exchange for q in self.declared if q.kind == "topic"}
        """topic queue -> its exchange: ``queue=`` with a ``routing_key`` routes through it."""
        self.default_topic = default_exchange if default_exchange in self.topics else None
        """``task_default_exchange`` when it is a topic exchange: a bare ``routing_key``
        goes through it, as on RabbitMQ."""
        self.special = bool(self.fanout or self.topics)
        """Whether a send may need ``resolve`` (a fanout group or a topic exchange)."""
        self.exchanges = frozenset(q.exchange for q in self.declared if q.exchange)
        """The exchanges declared queues are bound to (``exchange=`` may name one)."""
        self.default = self._default_queue(settings)
        """Where a task no router names goes."""
        if settings.task_default_exchange:
            self.exchanges |= {settings.task_default_exchange}
        self.routers = routers(settings.task_routes or {}, self)

    def route(self, task_name: str) -> str:
        """The first router's queue (or ``Route``) for ``task_name``, else the default."""
        for router in self.routers:
            queue = router(task_name)
            if queue:
                return queue
        return self.default

    def resolve(self, queue: str | None, exchange: Any, routing_key: str | None
                ) -> str | None:
        """Where a send with these options goes: a fanout group or a topic exchange's
        matching queues as a ``Route`` (``queue`` a topic queue with a ``routing_key``:
        its exchange's, as Celery routes it), else the named queue, else the queue bound
        by ``routing_key`` (None: no option says)."""
        name = getattr(exchange, "name", exchange) or None
        if queue in self.topic_of and routing_key and name in (None, self.topic_of[queue]):
            # Celery's: a topic queue gives the exchange, the routing key the queues.
            name, queue = self.topic_of[queue], None
        if name is None and routing_key and not queue:
            name = self.default_topic  # Celery sends through task_default_exchange
        if name in self.fanout:
            return Route(name, (name,), fanout=True)
        if queue and queue in self.fanout:
            return Route(queue, (queue,), fanout=True)
        if name in self.topics and not queue:
            key = routing_key or ""
            return Route(name, tuple(q.name for q in self.topics[name]
                                     if topic_matches(q.routing_key, key)))
        if queue:
            return queue
        return self.queue_for_key(routing_key) if routing_key else None

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
                isinstance(queue, Route) or any(q.name == queue for q in self.declared):
            return queue
        raise ConfigurationError(
            f"queue {queue!r} is not declared in task_queues and "
            f"task_create_missing_queues is False (declared: "
            f"{', '.join(q.name for q in self.declared)})")

    def queue_for_key(self, routing_key: str) -> str:
        """The queue ``task_queues`` binds by ``routing_key``, else the queue of that name."""
        return self.by_key.get(routing_key, routing_key)

    def worker_queues(self, queues: list[str], hostname: str) -> list[tuple[str, str | None]]:
        """What a worker named ``hostname`` consumes for ``queues``: each as
        ``(queue, fanout group or None)``, with its ``worker_direct`` queue last."""
        out: list[tuple[str, str | None]] = [
            (fanout_queue(q, hostname), q) if q in self.fanout else (q, None) for q in queues]
        if self.settings.worker_direct:
            out.append((direct_queue(hostname), None))
        return out

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
        if exchange in self.topics:
            route = self.resolve(None, exchange, key)
            if isinstance(route, Route) and route.queues:
                return route
        if key not in self.by_key:
            raise ConfigurationError(
                f"task_default_routing_key={key!r}: no queue of task_queues is bound by it "
                "(unrouted tasks would reach no queue)")
        return self.by_key[key]

    @property
    def default_queues(self) -> list[str]:
        """What a worker without ``-Q`` consumes: ``task_queues``, else the default queue."""
        return [q.name for q in self.declared] or [self.settings.task_default_queue]
