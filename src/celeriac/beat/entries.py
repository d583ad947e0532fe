"""``BeatEntry``: one periodic task, read from Celery's dict form and kept in the store.

Celery's form (``beat_schedule``)::

    {"task": "proj.add", "schedule": crontab(...) | 30.0 | timedelta(...),
     "args": (...), "kwargs": {...}, "options": {"queue": ..., "priority": ...,
     "expires": ..., "missed_runs": "once" | "all" | "skip"}}

In the store an entry is JSON (``to_json``/``from_json``): the schedule as its
``to_dict()``, the rest as plain data, plus ``enabled`` and where it came from
(``config``: ``beat_schedule`` or ``add_periodic_task``; ``runtime``: ``app.beat.add`` or
the CLI). Every error names the entry and the field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from ..errors import ConfigurationError
from . import schedules

MISSED_POLICIES = ("once", "all", "skip")
FIELDS = frozenset({"task", "schedule", "args", "kwargs", "options", "relative"})
SEND_OPTIONS = frozenset({
    "queue", "routing_key", "exchange", "priority", "expires", "countdown", "headers",
    "serializer", "compression", "time_limit", "soft_time_limit", "ignore_result", "shadow",
    "retry", "retry_policy"})
"""``apply_async`` options an entry may carry (``missed_runs`` is beat's own)."""


@dataclass(frozen=True, slots=True)
class BeatEntry:
    name: str
    task: str
    schedule: Any
    """A schedule of ``celeriac.schedules`` (``next_run(after) -> datetime``)."""
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    enabled: bool = True
    source: str = "config"
    """``config`` (``beat_schedule``, ``add_periodic_task``) or ``runtime``."""

    @property
    def missed_runs(self) -> str | None:
        """This entry's own policy for missed windows (None: ``beat_missed_runs``)."""
        value: str | None = self.options.get("missed_runs")
        return value

    def send_options(self) -> dict[str, Any]:
        return {k: v for k, v in self.options.items() if k != "missed_runs"}

    def with_enabled(self, enabled: bool) -> BeatEntry:
        return replace(self, enabled=enabled)

    # -- the store's JSON ---------------------------------------------------------------
    def to_json(self) -> bytes:
        return orjson.dumps({
            "task": self.task, "schedule": self.schedule.to_dict(), "args": list(self.args),
            "kwargs": dict(self.kwargs), "options": _plain_options(self.name, self.options),
            "enabled": self.enabled, "source": self.source,
        })

    @classmethod
    def from_json(cls, name: str, data: bytes | str) -> BeatEntry:
        d = orjson.loads(data)
        try:
            schedule = schedule_from_dict(d["schedule"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigurationError(f"beat entry {name!r}: schedule: cannot read "
                                     f"{d.get('schedule')!r} from the store: {exc}") from None
        return cls(name=name, task=d["task"], schedule=schedule,
                   args=tuple(d.get("args") or ()), kwargs=dict(d.get("kwargs") or {}),
                   options=dict(d.get("options") or {}), enabled=bool(d.get("enabled", True)),
                   source=str(d.get("source", "config")))

    def describe(self) -> dict[str, Any]:
        """The entry as the CLI and the dashboard show it."""
        return {"name": self.name, "task": self.task, "schedule": str(self.schedule),
                "schedule_data": self.schedule.to_dict(), "args": list(self.args),
                "kwargs": dict(self.kwargs), "options": dict(self.options),
                "enabled": self.enabled, "source": self.source}


def schedule_from_dict(d: Mapping[str, Any]) -> Any:
    """A schedule from its ``to_dict()`` form (``celeriac.schedules.from_dict``)."""
    return schedules.from_dict(d)


def parse_entry(name: Any, value: Any, *, source: str = "config") -> BeatEntry:
    """An entry from Celery's dict form; ``ConfigurationError`` names entry and field."""
    if not isinstance(name, str) or not name or len(name) > 200:
        raise ConfigurationError(f"beat_schedule: entry names must be non-empty strings "
                                 f"(at most 200 characters), got {name!r}")
    where = f"beat_schedule[{name!r}]"
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"{where} must be a dict with 'task' and 'schedule', got "
                                 f"{type(value).__name__}")
    unknown = set(value) - FIELDS
    if unknown:
        raise ConfigurationError(f"{where}: unknown field(s) {', '.join(sorted(unknown))} "
                                 f"(fields: {', '.join(sorted(FIELDS))})")
    task = value.get("task")
    if not isinstance(task, str) or not task:
        raise ConfigurationError(f"{where}: task must be a task name, got {task!r}")
    if "schedule" not in value:
        raise ConfigurationError(f"{where}: schedule is missing")
    try:
        schedule = schedules.maybe_schedule(value["schedule"])
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"{where}: schedule: {exc}") from None
    args = value.get("args")
    args = () if args is None else args
    if isinstance(args, (str, bytes)) or not isinstance(args, (list, tuple)):
        raise ConfigurationError(f"{where}: args must be a list or tuple, got {args!r}")
    kwargs = value.get("kwargs")
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise ConfigurationError(f"{where}: kwargs must be a dict with string keys, got "
                                 f"{kwargs!r}")
    options = dict(value.get("options") or {})
    check_options(where, options)
    entry = BeatEntry(name=name, task=task, schedule=schedule, args=tuple(args),
                      kwargs=dict(kwargs), options=options, source=source)
    try:
        orjson.dumps([entry.args, entry.kwargs])
    except TypeError as exc:
        raise ConfigurationError(f"{where}: args/kwargs must be JSON data (the entry is "
                                 f"kept in a shared store): {exc}") from None
    return entry


def check_options(where: str, options: dict[str, Any]) -> None:
    unknown = set(options) - SEND_OPTIONS - {"missed_runs"}
    if unknown:
        raise ConfigurationError(f"{where}: options: {', '.join(sorted(unknown))} not "
                                 f"supported (options: {', '.join(sorted(SEND_OPTIONS))}, "
                                 "missed_runs)")
    missed = options.get("missed_runs")
    if missed is not None and missed not in MISSED_POLICIES:
        raise ConfigurationError(f"{where}: options: missed_runs must be one of "
                                 f"{', '.join(MISSED_POLICIES)}, got {missed!r}")
    priority = options.get("priority")
    if priority is not None and (not isinstance(priority, int) or not 0 <= priority <= 9):
        raise ConfigurationError(f"{where}: options: priority must be 0-9, got {priority!r}")
    expires = options.get("expires")
    if isinstance(expires, timedelta):
        options["expires"] = expires.total_seconds()
    elif isinstance(expires, datetime):
        raise ConfigurationError(f"{where}: options: expires must be seconds (a periodic "
                                 f"task runs again and again), got {expires!r}")
    elif expires is not None and (not isinstance(expires, (int, float))
                                  or isinstance(expires, bool) or not math.isfinite(expires)
                                  or expires <= 0):
        raise ConfigurationError(f"{where}: options: expires must be a number of seconds "
                                 f"> 0 or None (no expiry), got {expires!r}")


def _plain_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    try:
        orjson.dumps(dict(options))
    except TypeError as exc:
        raise ConfigurationError(f"beat entry {name!r}: options must be JSON data: "
                                 f"{exc}") from None
    return dict(options)


def bind_tz(entry: BeatEntry, tz: Any) -> BeatEntry:
    """``entry`` with its schedule read in the app's zone ``tz``, unless the schedule
    names a zone of its own (a schedule's zone defaults to UTC: UTC means "unset")."""
    if entry.schedule.tz is not UTC or tz is UTC:
        return entry
    return replace(entry, schedule=entry.schedule.with_tz(tz))


def entries_from_settings(beat_schedule: Mapping[str, Any]) -> dict[str, BeatEntry]:
    return {name: parse_entry(name, value) for name, value in beat_schedule.items()}


def from_periodic(schedule: Any, sig: Any, args: Sequence[Any], kwargs: Mapping[str, Any] | None,
                  name: str | None, options: Mapping[str, Any]) -> BeatEntry:
    """``app.add_periodic_task``'s arguments as an entry: ``sig`` is a signature (its
    args, kwargs and options; plain ones only), a task, or a task name."""
    sig_options: dict[str, Any] = {}
    if isinstance(sig, Mapping) and "task" in sig:
        if sig.get("subtask_type"):
            raise ConfigurationError(f"add_periodic_task: a {sig['subtask_type']} cannot be "
                                     "a periodic task yet; give a task signature")
        task = str(sig["task"])
        args = (*tuple(sig.get("args") or ()), *args)
        kwargs = {**dict(sig.get("kwargs") or {}), **dict(kwargs or {})}
        sig_options = {k: v for k, v in dict(sig.get("options") or {}).items()
                       if k in SEND_OPTIONS or k == "missed_runs"}
    elif isinstance(sig, str):
        task = sig
    elif isinstance(getattr(sig, "name", None), str):
        task = sig.name  # a task
    else:
        raise ConfigurationError(f"add_periodic_task: expected a signature, a task or a "
                                 f"task name, got {sig!r}")
    if name is None:
        shown = [*map(repr, args), *(f"{k}={v!r}" for k, v in (kwargs or {}).items())]
        name = f"{task}({', '.join(shown)})"[:200]  # Celery names it after the call
    return parse_entry(name, {"task": task, "schedule": schedule, "args": tuple(args),
                              "kwargs": dict(kwargs or {}),
                              "options": {**sig_options, **options}})
