"""The request of the running task: what a message sent from inside a task takes its
``parent_id`` and ``root_id`` from, and the short reprs of a call's arguments.

Below the producer (``producer/`` reads ``current_request()``; ``tasks.py`` sets it and
re-exports all of it, where users import it from).
"""

from __future__ import annotations

import contextvars
import reprlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

_current: contextvars.ContextVar[Request | None] = contextvars.ContextVar(
    "celeriac.current_request", default=None)


def current_request() -> Request | None:
    """The request of the task running in this thread (or coroutine), if any: what a
    message sent from inside a task takes its ``parent_id`` and ``root_id`` from."""
    return _current.get()


_repr = reprlib.Repr()
_repr.maxstring = 256
_repr.maxother = 256


@dataclass(slots=False)
class Request:
    """What ``self.request`` shows a bound task about the current call."""

    id: str = ""
    task: str = ""
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    retries: int = 0
    eta: str | None = None
    expires: str | None = None
    root_id: str | None = None
    parent_id: str | None = None
    group: str | None = None
    hostname: str | None = None
    delivery_info: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, Any] = field(default_factory=dict)
    timelimit: tuple[float | None, float | None] = (None, None)
    is_eager: bool = False
    called_directly: bool = True
    children: list[Any] | None = None
    """What this call sent, as result tuples: stored with its result (``children``)."""
    group_index: int | None = None
    """Its place in its group (the ``group_index`` header)."""
    callbacks: list[Any] | None = None
    """The message's ``link`` signatures (its embed's ``callbacks``), as Celery's."""
    errbacks: list[Any] | None = None
    """The message's ``link_error`` signatures (its embed's ``errbacks``)."""
    chain: list[Any] | None = None
    """The rest of its chain, last step first (its embed's ``chain``)."""
    chord: Any = None
    """The body of the chord whose header it is part of (its embed's ``chord``)."""
    replaced_task_nesting: int = 0
    chord_additions: list[Any] | None = None
    """What ``Task.add_to_chord`` added to its chord: sent as it ends."""
    """How many ``Task.replace`` calls led to this task (Celery's header)."""
    properties: Mapping[str, Any] = field(default_factory=dict)
    """The message's properties (AMQP's, as kombu reports them: ``app_id``,
    ``priority``, ``correlation_id``...)."""

    @property
    def stamped_headers(self) -> list[str]:
        """Celery's: the names of the stamps the message carries (canvas stamping)."""
        names = self.headers.get("stamped_headers") or []
        return [names] if isinstance(names, str) else list(names)

    @property
    def stamps(self) -> dict[str, Any]:
        """Celery's: each stamp's value, by name (``stamped_headers`` only)."""
        values = self.headers.get("stamps") or {}
        return {name: values.get(name) for name in self.stamped_headers} \
            if isinstance(values, Mapping) else {}

    def get(self, key: str, default: Any = None) -> Any:
        """Celery's ``request.get(name, default)``."""
        return getattr(self, key, default)

    def add_child(self, result: Any) -> None:
        """Record a result this call sent (Celery's ``add_trail``)."""
        if self.children is None:
            self.children = []
        self.children.append(result.as_tuple())

    @property
    def name(self) -> str:
        """The task's name (Celery's worker-side request calls it ``name``)."""
        return self.task


def short_repr(value: Any) -> str:
    """``repr`` with long strings, containers and objects cut short (about 256 chars)."""
    return _repr.repr(value)


def args_repr(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[str, str]:
    # Every delay() makes these. No arguments, or a few plain ones, is the common case:
    # plain repr gives what reprlib would (nothing there is cut), without its dispatch.
    if not args:
        a = "()"
    elif len(args) <= _repr.maxtuple and all(map(_plain, args)):
        a = repr(tuple(args))
    else:
        a = _repr.repr(tuple(args))
    if not kwargs:
        k = "{}"
    elif len(kwargs) <= _repr.maxdict and all(type(key) is str for key in kwargs) and all(
            map(_plain, kwargs)) and all(map(_plain, kwargs.values())):
        # reprlib sorts a dict's keys (names here: they compare).
        k = "{" + ", ".join([f"{key!r}: {kwargs[key]!r}" for key in sorted(kwargs)]) + "}"
    else:
        k = _repr.repr(dict(kwargs))
    return a, k


_PLAIN_TYPES = frozenset({bool, float, type(None)})
_LONG_INT = 10 ** (_repr.maxlong - 2)


def _plain(value: Any) -> bool:
    """Whether reprlib leaves ``value``'s repr whole: a bool, float or None, an int of
    fewer digits than its ``maxlong``, a printable string short enough that even doubled
    escapes stay under its ``maxstring``."""
    kind = type(value)
    if kind is str:
        return len(value) <= (_repr.maxstring - 2) // 2 and value.isprintable()
    if kind is int:
        return bool(-_LONG_INT < value < _LONG_INT)
    return kind in _PLAIN_TYPES
