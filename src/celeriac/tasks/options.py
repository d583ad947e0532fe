"""A task's options (``@app.task(...)``'s keywords, Celery's names), and those of a
class-based task, read from its class attributes."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from . import Task


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
    retry_kwargs: Mapping[str, Any] | None = None
    """Celery's: what ``autoretry_for`` passes to ``retry()`` (``max_retries``,
    ``countdown``...)."""
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
    typing: bool = True
    """Celery's: check a call's arguments against the function's signature where it is
    sent (``delay``/``apply_async`` raise ``TypeError`` in the caller); False: don't."""
    pydantic: bool = False
    """Celery's: arguments annotated with a pydantic model are validated into it where
    the task runs, and a returned model is sent as its ``model_dump()``."""
    pydantic_strict: bool = False
    pydantic_context: Mapping[str, Any] | None = None
    pydantic_dump_kwargs: Mapping[str, Any] | None = None
    # Flow control (docs/guide/flow-control.md; producer/flow.py, worker/limits.py).
    unique_for: float | None = None
    """Seconds: while a job with the same key is queued or running, ``delay()`` returns
    its result and sends nothing; the lock lasts at most this long."""
    unique_key: Callable[[Any, Any], Any] | None = None
    """``(args, kwargs) -> key`` for ``unique_for``; None: the task's arguments."""
    unique_mode: str = "until_finished"
    """When the unique lock goes: ``until_finished``, ``until_started``, or
    ``debounce`` (each call delayed ``unique_for``; the last one within it runs)."""
    concurrency: int | None = None
    """At most this many run at once across the cluster (per key with
    ``concurrency_key``)."""
    concurrency_key: Callable[[Any, Any], Any] | None = None
    """``(args, kwargs) -> key``: ``concurrency`` counts per key."""


def class_based(cls: type[Task[Any, Any]]) -> tuple[Callable[..., Any], TaskOptions]:
    """A bare ``Task`` subclass's function (its ``run``, bound: ``self`` is the task)
    and options (its class attributes; its ``name``, else module and class name)."""
    run = getattr(cls, "run", None)
    if not callable(run):
        raise TypeError(f"{cls.__name__}() needs a run() method, or app, fn and options")
    name = cls.__dict__.get("name") or getattr(cls, "name", None)
    if not isinstance(name, str):
        name = f"{cls.__module__}.{cls.__qualname__}"
    defaults = dict(cls.option_defaults)
    if isinstance(defaults.get("autoretry_for"), list):
        defaults["autoretry_for"] = tuple(defaults["autoretry_for"])
    defaults["bind"] = True
    return run, TaskOptions(name=name, **defaults)
