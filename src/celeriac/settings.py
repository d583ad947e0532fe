"""The one typed settings object.

Names follow Celery's where a Celery user would look for them. ``Settings`` is frozen:
derive a changed copy with ``settings.replace(name=value)``. Nothing here reads the
environment at import time; ``Settings.from_env()`` does so when called.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigurationError

DEFAULT_URL = "sqlite:///celeriac.db"
ENV_PREFIX = "CELERIAC_"


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    broker_url: str = DEFAULT_URL
    """Where messages go. ``sqlite:///path``, ``memory://``; several URLs separated by ``;``."""
    result_backend: str | None = None
    """Where results go; ``None`` uses the broker URL's scheme and location."""

    task_default_queue: str = "celery"
    """Celery's default, so celeriac and Celery workers in one deployment share it."""
    task_routes: Mapping[str, str] | Callable[[str], str | None] = field(default_factory=dict)
    """Task name (or ``fnmatch`` glob) to queue name; or a function of the task name that
    returns a queue name (None: the default queue)."""
    task_default_priority: int = 0
    """0-9; higher runs first (AMQP semantics)."""
    task_serializer: str = "json"
    result_serializer: str = "json"
    accept_content: tuple[str, ...] = ("json",)
    """Serializers a worker and a result reader accept. Add ``"pickle"`` only if you trust
    every producer."""
    task_acks_late: bool = True
    """At-least-once: acknowledge after the task finishes. ``False`` acks before running."""
    task_track_started: bool = False
    task_ignore_result: bool = False
    task_always_eager: bool = False
    """Run tasks in the calling process (tests); nothing is sent."""
    task_time_limit: float | None = None
    task_soft_time_limit: float | None = None
    task_max_retries: int = 3
    task_default_retry_delay: float = 180.0
    task_max_deliveries: int = 3
    """A message lost this many times (its worker died) goes to the dead-letter queue."""
    task_default_rate_limit: str | float | None = None
    """Rate limit of tasks that set none (``"10/s"``, ``"100/m"``, ``"1000/h"``)."""
    task_redelivery_delay: float = 1.0
    """Seconds a message whose pool child died waits in the delay store before it is
    delivered again, doubling with each loss (capped at 60 s); 0: at once. A task that
    crashes its process every time thus cannot spin the pool."""

    result_expires: float | None = 86400.0
    """Seconds a result is kept; ``None`` keeps results forever."""
    result_exception_allowlist: tuple[type[BaseException], ...] = ()
    """Exception types that ``AsyncResult.get()`` may re-create besides builtins'."""

    worker_concurrency: int | None = None
    """Pool size; ``None`` means the number of CPUs (1 for the solo pool)."""
    worker_prefetch_multiplier: int = 4
    worker_pool: str = "prefork"
    worker_disable_rate_limits: bool = False
    """Ignore every task's rate limit."""
    worker_lease_timeout: float = 10.0
    """A worker silent this long is presumed dead and its messages return to their queues."""
    worker_max_tasks_per_child: int | None = None
    """Recycle a pool child after this many tasks."""
    worker_max_memory_per_child: int | None = None
    """Recycle a pool child, after its task, once its resident memory exceeds this (KiB)."""
    worker_proc_alive_timeout: float = 4.0
    """A pool child that does not report up within this many seconds is replaced."""
    worker_max_restarts: int = 10
    worker_restart_window: float = 10.0
    """More than ``worker_max_restarts`` unplanned child deaths in this many seconds stop
    the worker instead of fork-looping."""
    worker_autoscale: tuple[int, ...] | None = None
    """``(max, min)`` pool size for the autoscaler (prefork only)."""
    worker_autoscale_cooldown: float = 10.0
    """Seconds a pool must have had idle children before the autoscaler shrinks it."""

    worker_send_task_events: bool = False
    """Send task events (``-E``): received, started, succeeded, failed, retried, ..."""
    worker_enable_heartbeat: bool = True
    """Send ``worker-online``/``-heartbeat``/``-offline`` (``--without-heartbeat``: off)."""
    worker_heartbeat_interval: float = 2.0
    """Seconds between ``worker-heartbeat`` events; monitors expire a worker after 2x."""
    task_send_sent_event: bool = False
    """Producers send a ``task-sent`` event for every message they publish."""
    events_hide_args: bool = False
    """Leave task arguments out of events altogether (they may hold personal data)."""
    events_buffer_limit: int = 1000
    """Task events are sent in batches of up to this many..."""
    events_flush_interval: float = 0.1
    """...or after this many seconds, whichever comes first."""
    events_offline_buffer: int = 10_000
    """Events kept while the broker is unreachable; the oldest are dropped beyond it."""

    max_message_size: int = 64 * 1024 * 1024

    broker_connection_retry: bool = True
    """Retry a failed connection (producers and workers) with exponential backoff and
    jitter before raising ``OperationalError``."""
    broker_connection_max_retries: int | None = 5
    """Retries for a producer before it gives up (``None``: forever). Workers retry
    forever while running."""
    broker_connection_timeout: float = 4.0
    """Seconds to wait for one connection attempt."""
    broker_failover_strategy: str = "round-robin"
    """With several ``;``-separated broker URLs: ``round-robin`` (in order) or ``shuffle``."""
    broker_transport_options: Mapping[str, str] = field(default_factory=dict)
    """Transport-specific options, e.g. ``{"queue_type": "quorum"}`` for RabbitMQ."""

    def __post_init__(self) -> None:
        if not 0 <= self.task_default_priority <= 9:
            raise ConfigurationError(
                f"task_default_priority must be 0-9, got {self.task_default_priority!r}"
            )
        if self.worker_prefetch_multiplier < 1:
            raise ConfigurationError(
                "worker_prefetch_multiplier must be >= 1, "
                f"got {self.worker_prefetch_multiplier!r}"
            )
        if self.worker_concurrency is not None and self.worker_concurrency < 1:
            raise ConfigurationError(
                f"worker_concurrency must be >= 1, got {self.worker_concurrency!r}"
            )
        if not 0 <= self.task_redelivery_delay <= 3600:
            raise ConfigurationError(
                f"task_redelivery_delay must be 0-3600 seconds, got "
                f"{self.task_redelivery_delay!r}"
            )
        if self.task_max_deliveries < 1:
            raise ConfigurationError(
                f"task_max_deliveries must be >= 1, got {self.task_max_deliveries!r}"
            )
        if self.worker_lease_timeout <= 0:
            raise ConfigurationError(
                f"worker_lease_timeout must be > 0, got {self.worker_lease_timeout!r}"
            )
        if self.worker_heartbeat_interval <= 0:
            raise ConfigurationError(
                f"worker_heartbeat_interval must be > 0, got {self.worker_heartbeat_interval!r}"
            )
        if self.events_buffer_limit < 1 or self.events_offline_buffer < 1:
            raise ConfigurationError(
                "events_buffer_limit and events_offline_buffer must be >= 1, got "
                f"{self.events_buffer_limit!r} and {self.events_offline_buffer!r}"
            )
        if self.max_message_size < 1:
            raise ConfigurationError(
                f"max_message_size must be >= 1, got {self.max_message_size!r}"
            )

    @property
    def backend_url(self) -> str:
        return self.result_backend or self.broker_url.split(";")[0]

    def replace(self, **changes: Any) -> Settings:
        unknown = set(changes) - _FIELD_NAMES
        if unknown:
            raise ConfigurationError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_object(cls, obj: object) -> Settings:
        """Settings from a mapping, or from the lowercase attributes of a module or object."""
        if isinstance(obj, Mapping):
            values = dict(obj)
        else:
            values = {n: getattr(obj, n) for n in _FIELD_NAMES if hasattr(obj, n)}
        return cls().replace(**values)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Settings from ``CELERIAC_<NAME>`` variables, e.g. ``CELERIAC_BROKER_URL``."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is not None:
                values[f.name] = _parse(f.name, _HINTS[f.name], raw)
        return cls(**values)


_FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(Settings))
_HINTS = typing.get_type_hints(Settings)


def _parse(name: str, hint: Any, raw: str) -> Any:
    """Turn an environment string into the field's type."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if type(None) in args and raw.strip().lower() in ("", "none", "null"):
            return None
        # The environment can only spell the first (plain data) member of a union.
        hint = next(a for a in args if a is not type(None))
    try:
        if hint is bool:
            lowered = raw.strip().lower()
            if lowered not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError(raw)
            return lowered in ("1", "true", "yes", "on")
        if hint in (int, float, str):
            return hint(raw)
        if typing.get_origin(hint) is tuple:
            item = typing.get_args(hint)[0]
            if item not in (int, float, str):
                raise ConfigurationError(f"{ENV_PREFIX}{name.upper()} cannot be set from "
                                         "the environment")
            return tuple(item(p.strip()) for p in raw.split(",") if p.strip())
        if typing.get_origin(hint) is Mapping:
            pairs = (p.split("=", 1) for p in raw.split(",") if p.strip())
            return {k.strip(): v.strip() for k, v in pairs}
    except ValueError:
        raise ConfigurationError(
            f"{ENV_PREFIX}{name.upper()}={raw!r} is not a valid {hint}"
        ) from None
    raise ConfigurationError(f"{ENV_PREFIX}{name.upper()} cannot be set from the environment")
