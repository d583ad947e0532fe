"""Reading configuration the way Celery users write it, and ignoring none of it.

Every one of Celery's 207 settings (``celery_names.py``) is one of:

- **implemented**: a ``Settings`` field of the same name;
- **converted**: a Celery setting expressed in celeriac's terms (``CONVERTED``), e.g.
  ``worker_disable_prefetch=True`` is ``worker_prefetch_multiplier=1``;
- **harmless**: a tuning knob of Celery's own machinery that changes no behaviour a user
  relies on (``HARMLESS``), or a setting of a service celeriac does not have
  (``OTHER_SERVICES``: ``cassandra_*``...): accepted with one warning per process, and
  kept (``Settings.inert``) so that ``app.conf`` reads it back;
- **refused**: a behaviour celeriac does not provide (``REFUSED``, with the reason): a
  ``ConfigurationError``, unless the value is Celery's default (asking for the default
  asks for nothing).

A name that is none of these (a typo) raises ``ConfigurationError`` with the closest
known name. ``tests/unit/test_config.py`` holds every Celery name to this.
"""

from __future__ import annotations

import logging
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any

from ..errors import ConfigurationError
from .celery_names import DEFAULTS as CELERY_DEFAULTS
from .celery_names import OLD_NAMES

logger = logging.getLogger("celeriac.config")

OTHER_SERVICES = ("arangodb_", "azureblockblob_", "cassandra_", "cosmosdbsql_",
                  "couchbase_", "elasticsearch_", "gcs_", "mongodb_", "s3_", "cache_backend")
"""Prefixes of the settings of Celery's result backends celeriac does not have. They
configure a service nothing here uses, so they are harmless: accepted and kept (``app.conf``
reads them back), with one warning naming them. Asking to use that service
(``result_backend="cassandra://"``) is the error, naming the URL's scheme."""
_OTHER_SERVICES_REASON = ("celeriac has no such result backend, so they configure nothing "
                          "(result_backend may be redis://, postgresql://, mysql://, "
                          "rpc://, sqlite:// or memory://)")
_OTHER_BACKENDS = (*OTHER_SERVICES, "database_")
"""Refused unless default: ``database_*`` (the SQLAlchemy backend's table names and
engine options), which celeriac's ``db+postgresql://`` does not honour."""
_BACKENDS_REASON = ("this result backend is not available in celeriac (result_backend may "
                    "be redis://, postgresql://, mysql://, rpc://, sqlite:// or memory://)")

_DATABASE_REASON = ("celeriac's db+postgresql:// result backend uses Celery's default "
                    "tables and its own connections (the SQLAlchemy backend's database_* "
                    "options are not honoured)")

INERT = "inert"
"""The ``Settings`` field that keeps the harmless settings' values."""

HARMLESS: dict[str, str] = {
    **dict.fromkeys([
        "broker_channel_error_retry", "broker_connection_retry_on_startup", "broker_heartbeat",
        "broker_heartbeat_checkrate", "broker_pool_acquire_timeout", "broker_pool_limit",
        "broker_native_delayed_delivery_queue_type"],
        "celeriac manages its broker connections itself (one per process and thread; a "
        "worker retries forever, a producer per broker_connection_max_retries)"),
    **dict.fromkeys([
        "redis_max_connections", "redis_retry_on_timeout", "redis_socket_connect_timeout",
        "redis_socket_keepalive", "redis_socket_timeout", "redis_backend_health_check_interval",
        "result_backend_always_retry", "result_backend_base_sleep_between_retries_ms",
        "result_backend_max_retries", "result_backend_max_sleep_between_retries_ms",
        "result_cache_max", "result_persistent",
        "result_exchange", "result_exchange_type"],
        "the result backend's connections and retries are celeriac's own"),
    **dict.fromkeys([
        "control_queue_durable", "control_queue_exclusive",
        "control_queue_expires", "control_queue_ttl",
        "event_queue_durable", "event_queue_exclusive", "event_queue_expires",
        "event_queue_prefix", "event_queue_ttl"],
        "events and control use celeriac's own broadcast channels"),
    **dict.fromkeys([
        "worker_hijack_root_logger", "worker_log_color", "worker_log_datefmt",
        "worker_log_format", "worker_redirect_stdouts", "worker_redirect_stdouts_level",
        "worker_task_log_datefmt", "worker_task_log_format"],
        "the worker's log format is celeriac's (configure logging in setup_logging)"),
    **dict.fromkeys([
        "worker_lost_wait", "worker_pool_putlocks", "worker_pool_restarts",
        "worker_timer_precision", "worker_eta_task_limit",
        "worker_enable_prefetch_count_reduction",
        "worker_cancel_long_running_tasks_on_connection_loss", "worker_detect_quorum_queues",
        "worker_soft_shutdown_timeout", "worker_enable_soft_shutdown_on_idle",
        "task_remote_tracebacks", "task_repr_maxlevels", "task_create_missing_queue_type",
        "task_create_missing_queue_exchange_type", "task_queue_max_priority",
        "result_accept_content"],
        "celeriac's worker does this its own way (docs/migrating.md)"),
    **dict.fromkeys([
        "beat_cron_starting_deadline", "beat_enable_remote_control",
        "beat_remote_control_max_tick_age", "beat_sync_every"],
        "celeriac beat keeps its state in the shared store and is changed there "
        "(app.beat, `celeriac beat add|remove|enable|disable`)"),
    "beat_schedule_filename": "celeriac beat keeps its state in the broker's or result "
                              "backend's store, not in a local file",
    **dict.fromkeys([
        "result_chord_expires", "result_chord_join_timeout"],
        "celeriac counts chords in the result backend (chord state expires with "
        "result_expires); where chords are polled (db+postgresql://), "
        "result_chord_retry_interval applies"),
}
"""Accepted, with one warning naming the reason."""

REFUSED: dict[str, str] = {
    "task_default_delivery_mode": "messages are always persistent",
    "task_store_eager_result": "eager results are not stored",
    "task_store_errors_even_if_ignored": "ignored results are never stored",
    "task_inherit_parent_priority": "priorities are not inherited",
    "task_acks_on_failure_or_timeout": "a failed task's message is always acknowledged; "
                                       "use task_max_deliveries for worker loss",
    "task_acks_on_failure": "a failed task's message is always acknowledged",
    "task_acks_on_timeout": "a timed-out task's message is always acknowledged",
    "task_protocol": "celeriac speaks task protocol 2 only",
    "task_default_queue_type": "set broker_transport_options={'queue_type': 'quorum'}",
    "worker_pool_start_method": "the prefork pool forks",
    "worker_agent": "custom worker classes are not supported",
    "worker_autoscaler": "custom worker classes are not supported",
    "worker_consumer": "custom worker classes are not supported",
    "worker_timer": "custom worker classes are not supported",
    "broker_use_ssl": "use a rediss:// or amqps:// broker_url",
    "redis_backend_use_ssl": "use a rediss:// result_backend",
    "broker_login_method": "AMQP logs in with the URL's user and password",
    "broker_read_url": "one broker_url serves reads and writes",
    "broker_write_url": "one broker_url serves reads and writes",
    "broker_transport": "the transport is the broker_url's scheme",
    "broker_host": "give the whole broker_url",
    "broker_port": "give the whole broker_url",
    "broker_user": "give the whole broker_url",
    "broker_password": "give the whole broker_url",
    "broker_vhost": "give the whole broker_url",
    "redis_host": "give the whole result_backend URL",
    "redis_port": "give the whole result_backend URL",
    "redis_db": "give the whole result_backend URL",
    "redis_username": "give the whole result_backend URL",
    "redis_password": "give the whole result_backend URL",
    "event_serializer": "events are JSON",
    # Under ?layout=kombu celeriac speaks on Celery's default exchanges: another name would
    # leave the two fleets deaf to each other.
    "control_exchange": "remote control uses Celery's default mailbox (celery.pidbox) "
                        "under ?layout=kombu, celeriac's own channels otherwise",
    "event_exchange": "events use Celery's default exchange (celeryev) under "
                      "?layout=kombu, celeriac's own channels otherwise",
    "result_failure_expires": "failed results expire with result_expires",
}
"""Refused unless the value is Celery's default (then nothing is asked for)."""


def _reject_on_worker_lost(value: Any) -> dict[str, Any]:
    # Celery's False acks a task whose process died (it fails with WorkerLostError);
    # one delivery then a dead letter with its FAILURE stored is that, without the loss.
    return {} if value else {"task_max_deliveries": 1}


def _publish_retry_policy(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"task_publish_retry_policy must be a dict, got {type(value).__name__}")
    if "max_retries" not in value:
        return {}
    return {"broker_connection_max_retries": value["max_retries"]}


CONVERTED: dict[str, Callable[[Any], dict[str, Any]]] = {
    "task_reject_on_worker_lost": _reject_on_worker_lost,
    "task_retry_on_worker_lost": _reject_on_worker_lost,
    "task_publish_retry": lambda v: {"broker_connection_retry": v},
    "task_publish_retry_policy": _publish_retry_policy,
    "worker_disable_prefetch": lambda v: {"worker_prefetch_multiplier": 1} if v else {},
    "worker_enable_remote_control": lambda v: {"worker_remote_control": v},
}
"""Celery settings whose meaning celeriac has under other names."""

_warned: set[str] = set()


def translate(values: Mapping[str, Any], fields: frozenset[str], source: str
              ) -> dict[str, Any]:
    """``values`` (lowercase Celery names) as celeriac settings; warns about harmless
    ones once, raises ``ConfigurationError`` for refused and unknown ones."""
    out: dict[str, Any] = {}
    inert: dict[str, Any] = {}
    services: list[str] = []
    for name, value in values.items():
        if name in fields:
            out[name] = value
        elif name in CONVERTED:
            out.update(CONVERTED[name](value))
        elif name in HARMLESS:
            inert[name] = value
            if name not in _warned:
                _warned.add(name)
                logger.warning("setting %s (from %s) has no effect in celeriac: %s", name,
                               source, HARMLESS[name])
        elif name.startswith(OTHER_SERVICES):
            inert[name] = value
            if name not in _warned:
                _warned.add(name)
                services.append(name)
        elif name in REFUSED or name.startswith(_OTHER_BACKENDS):
            if _is_default(name, value):
                continue
            reason = REFUSED.get(name) or (
                _DATABASE_REASON if name.startswith("database_") else _BACKENDS_REASON)
            raise ConfigurationError(f"setting {name}={value!r} (from {source}) is not "
                                     f"supported: {reason}")
        else:
            close = _close(name, [*fields, *CELERY_DEFAULTS])
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ConfigurationError(f"unknown setting {name!r} (from {source}){hint}")
    if services:
        logger.warning("settings %s (from %s) have no effect in celeriac: %s",
                       ", ".join(services), source, _OTHER_SERVICES_REASON)
    if inert:
        out[INERT] = inert
    return out


def is_inert(name: str) -> bool:
    """A Celery setting accepted with no effect (kept in ``Settings.inert``)."""
    return name in HARMLESS or name.startswith(OTHER_SERVICES)


def _is_default(name: str, value: Any) -> bool:
    default = CELERY_DEFAULTS.get(name)
    return value == default or (value in (None, (), [], {}) and default in (None, (), [], {}))


def from_mapping(values: Mapping[str, Any], namespace: str | None) -> dict[str, Any]:
    """Setting names from a mapping as Celery reads them: with ``namespace="CELERY"``,
    ``CELERY_TASK_SERIALIZER`` is ``task_serializer`` and other keys are not settings
    (Django's settings module holds everything); without, lowercase names and Celery's
    pre-4.0 uppercase names (``CELERYD_CONCURRENCY``, ``BROKER_URL``)."""
    out: dict[str, Any] = {}
    if namespace:
        prefix = namespace.rstrip("_") + "_"
        for key, value in values.items():
            if key.startswith(prefix):
                out[key[len(prefix):].lower()] = value
        return out
    for key, value in values.items():
        if key.startswith("_"):
            continue
        if key.islower():
            out[key] = value
        elif key in OLD_NAMES:
            out[OLD_NAMES[key]] = value
        elif key.isupper() and key.startswith(("CELERY", "BROKER_")):
            close = _close(key, OLD_NAMES)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ConfigurationError(f"unknown setting {key!r}{hint}")
    return out


def object_values(obj: object) -> dict[str, Any]:
    """The settings-like attributes of a module or object: plain values, not the
    modules, classes and functions a config module imports or defines."""
    out: dict[str, Any] = {}
    for name in dir(obj):
        if name.startswith("_"):
            continue
        value = getattr(obj, name)
        if isinstance(value, (types.ModuleType, type, types.FunctionType,
                              types.BuiltinFunctionType)):
            continue
        out[name] = value
    return out


def module_names(value: Any, name: str) -> tuple[str, ...]:
    """``include``/``imports``: a module name or an iterable of them."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Iterable) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ConfigurationError(f"{name} must be a module name or a list of them, got {value!r}")


# -- values: the forms Celery's docs show, turned into the field's type -------------------
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def coerce(name: str, hint: Any, value: Any) -> Any:
    """``value`` as the type ``hint`` of setting ``name``: strings of numbers and booleans
    (the environment, Django settings), lists for tuples, a timedelta for seconds; a
    ``ConfigurationError`` naming the setting for anything else."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(name, hint, args, value)
    convert = _BY_HINT.get(hint) or _BY_ORIGIN.get(origin)
    if convert is None:
        return value  # a type this function does not police (validated by its field)
    coerced = convert(name, args, value)
    if coerced is _UNFIT:
        raise ConfigurationError(f"{name}={value!r}: expected {_describe(hint)}, got "
                                 f"{type(value).__name__}")
    return coerced


def _coerce_union(name: str, hint: Any, args: tuple[Any, ...], value: Any) -> Any:
    """``value`` as the first member of the union it fits (None for an optional one)."""
    if value is None and type(None) in args:
        return None
    errors = []
    for member in (a for a in args if a is not type(None)):
        try:
            return coerce(name, member, value)
        except ConfigurationError as exc:
            errors.append(str(exc))
    raise ConfigurationError(errors[0] if len(errors) == 1 else
                             f"{name}={value!r}: expected {_describe(hint)}")


_UNFIT: Any = object()
"""What a converter returns for a value it cannot turn into its type."""
# A converter takes the setting's name, its type's arguments (``tuple[str, ...]``'s
# ``str``) and the value.
_Converter = Callable[[str, tuple[Any, ...], Any], Any]


def _to_bool(name: str, args: tuple[Any, ...], value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in (*_TRUE, *_FALSE):
        return value.strip().lower() in _TRUE
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    return _UNFIT


def _to_int(name: str, args: tuple[Any, ...], value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return _UNFIT


def _to_float(name: str, args: tuple[Any, ...], value: Any) -> Any:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return _UNFIT


def _to_str(name: str, args: tuple[Any, ...], value: Any) -> Any:
    return value if isinstance(value, str) else _UNFIT


def _to_tuple(name: str, args: tuple[Any, ...], value: Any) -> Any:
    item = args[0]
    if isinstance(value, str) and item is str:
        value = [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, (list, tuple, set, frozenset)):
        if item in (int, float, str):
            return tuple(coerce(name, item, v) for v in value)
        return tuple(value)
    return _UNFIT


def _to_mapping(name: str, args: tuple[Any, ...], value: Any) -> Any:
    return value if isinstance(value, Mapping) else _UNFIT


def _to_callable(name: str, args: tuple[Any, ...], value: Any) -> Any:
    return value if callable(value) else _UNFIT


# The converter of a setting's type: by the type itself, else by its generic's origin
# (``tuple[str, ...]``: ``tuple``). Other types, bare ``tuple`` and ``dict`` among them,
# are not policed.
_BY_HINT: dict[Any, _Converter] = {
    bool: _to_bool, int: _to_int, float: _to_float, str: _to_str,
    Mapping: _to_mapping, Callable: _to_callable,
}
_BY_ORIGIN: dict[Any, _Converter] = {
    tuple: _to_tuple, Mapping: _to_mapping, dict: _to_mapping, Callable: _to_callable,
}


def _describe(hint: Any) -> str:
    text = getattr(hint, "__name__", None) or str(hint)
    return text.replace("typing.", "").replace("collections.abc.", "")


# -- task_routes and task_annotations in Celery's forms ---------------------------------
ANNOTATABLE = frozenset({
    "rate_limit", "time_limit", "soft_time_limit", "max_retries", "default_retry_delay",
    "acks_late", "ignore_result", "track_started", "serializer", "priority", "queue",
    "autoretry_for", "retry_backoff", "retry_backoff_max", "retry_jitter", "expires",
    "global_rate_limit"})


def annotators(value: Any) -> tuple[Callable[[str], Mapping[str, Any]], ...]:
    """``task_annotations`` (a dict of task name or ``"*"`` to options, an object with
    ``annotate(task)``, or a list of those) as functions of the task name."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    out: list[Callable[[str], Mapping[str, Any]]] = []
    for item in items:
        if isinstance(item, Mapping):
            for key, options in item.items():
                _check_annotation(str(key), options)
            out.append(_by_table(dict(item)))
        elif callable(getattr(item, "annotate", None)):
            out.append(_by_object(item))
        else:
            raise ConfigurationError(f"task_annotations: expected a dict or an object with "
                                     f"annotate(task), got {type(item).__name__}")
    return tuple(out)


def _by_table(table: dict[str, Any]) -> Callable[[str], Mapping[str, Any]]:
    def annotate(task: str) -> Mapping[str, Any]:
        return {**table.get("*", {}), **table.get(task, {})}
    return annotate


def _by_object(item: Any) -> Callable[[str], Mapping[str, Any]]:
    def annotate(task: str) -> Mapping[str, Any]:
        return _checked(task, item.annotate(task))
    return annotate


def _checked(task: str, options: Any) -> Mapping[str, Any]:
    if options is None:
        return {}
    _check_annotation(task, options)
    return dict(options)


def _check_annotation(task: str, options: Any) -> None:
    if not isinstance(options, Mapping):
        raise ConfigurationError(f"task_annotations[{task!r}] must be a dict of task "
                                 f"options, got {options!r}")
    unknown = set(options) - ANNOTATABLE
    if unknown:
        raise ConfigurationError(
            f"task_annotations[{task!r}]: {', '.join(sorted(unknown))} cannot be annotated "
            f"(task options that can: {', '.join(sorted(ANNOTATABLE))})")


def _close(word: str, names: Iterable[str]) -> list[str]:
    """The name closest to a misspelt ``word``, if any (difflib is imported only here,
    on an error path: it is a few ms of every import otherwise)."""
    import difflib

    return difflib.get_close_matches(word, list(names), 1)
