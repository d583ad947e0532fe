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
    # No arguments is common (and bulk sends repeat it): skip reprlib's machinery.
    return (_repr.repr(tuple(args)) if args else "()",
            _repr.repr(dict(kwargs)) if kwargs else "{}")
