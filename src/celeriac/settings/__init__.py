"""The one typed settings object.

Names follow Celery's where a Celery user would look for them. ``Settings`` is frozen:
derive a changed copy with ``settings.replace(name=value)``. Nothing here reads the
environment at import time; ``Settings.from_env()`` does so when called.
"""

from __future__ import annotations

import dataclasses
import operator
import os
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError
from ..serialization import accepted_content_types, compression, get_serializer
from .celery_names import DEFAULTS as CELERY_DEFAULTS
from .config import INERT, annotators, coerce, from_mapping, is_inert, object_values, translate
from .rates import parse_rate
from .routing import Routing

if TYPE_CHECKING:
    from ..app import Celeriac

DEFAULT_URL = "sqlite:///celeriac.db"
ENV_PREFIX = "CELERIAC_"


# eq=False: __eq__ and __hash__ are written below (see there)
@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class Settings:
    broker_url: str = DEFAULT_URL
    """Where messages go. ``sqlite:///path``, ``memory://``; several URLs separated by ``;``."""
    result_backend: str | None = None
    """Where results go; ``None`` uses the broker URL's scheme and location."""

    task_default_queue: str = "celery"
    """Celery's default, so celeriac and Celery workers in one deployment share it."""
    task_routes: Any = None
    """Celery's forms: a dict of task name (or ``fnmatch`` glob) to a queue name or to
    ``{"queue": name}``; a router function (of the task name, or Celery's ``(name, args,
    kwargs, options, task=None, **kw)``) returning either; or a list of those, tried in
    order. No match: ``task_default_queue``."""
    task_default_exchange: str | None = None
    """Celery's: the exchange unrouted tasks go through; here only a name, which must be
    one ``task_queues`` binds to when it declares queues."""
    task_default_exchange_type: str = "direct"
    """Celery's: the type of ``task_default_exchange``, to which queues of
    ``task_queues`` declared without an exchange are bound: ``"direct"`` (a routing key
    names one queue) or ``"topic"`` (binding patterns such as ``"feed.#"``; a message
    goes to every queue whose pattern matches its key). See the routing guide."""
    task_default_routing_key: str | None = None
    """Celery's: the key unrouted tasks carry. With ``task_queues``, they go to the queue
    bound by it (it must be bound); without, to ``task_default_queue``."""
    task_create_missing_queues: bool = True
    """Celery's: False with ``task_queues`` makes sending to a queue they do not declare
    (and a worker's ``-Q`` naming one) an error; queues are otherwise made on first use."""
    task_queues: Any = None
    """Celery's forms: kombu ``Queue`` objects (direct, topic and fanout exchanges;
    ``kombu.common.Broadcast``), queue names, or a dict of name -> ``{"exchange": ...,
    "exchange_type": ..., "routing_key": ...}``. A worker started without ``-Q``
    consumes them all (else ``task_default_queue``); a route's or ``apply_async``'s
    ``routing_key`` reaches the queues bound by it; every worker consuming a fanout
    queue gets its own copy (Redis and RabbitMQ brokers)."""
    task_annotations: Any = None
    """Celery's forms: ``{"tasks.add": {"rate_limit": "10/s"}, "*": {...}}``, an object
    with ``annotate(task)``, or a list of those; option values that override the tasks'."""
    task_default_priority: int = 0
    """0-9; higher runs first (AMQP semantics)."""
    task_serializer: str = "json"
    """How task messages are encoded: ``json`` (orjson), ``msgpack`` or ``pickle``."""
    result_serializer: str = "json"
    """How results are encoded: ``json``, ``msgpack`` or ``pickle``."""
    accept_content: tuple[str, ...] = ("json",)
    """Serializers a worker and a result reader accept. Add ``"pickle"`` only if you trust
    every producer."""
    task_acks_late: bool = True
    """At-least-once: acknowledge after the task finishes. ``False`` acks before running."""
    task_track_started: bool = False
    """Store ``STARTED`` when a task begins (tasks may set ``track_started``)."""
    task_ignore_result: bool = False
    """Store no results (tasks may set ``ignore_result``)."""
    task_always_eager: bool = False
    """Run tasks in the calling process (tests); nothing is sent."""
    task_eager_propagates: bool = False
    """In eager mode, ``apply()``/``delay()`` raise a failed task's exception at once."""
    task_allow_error_cb_on_chord_header: bool = False
    """An errback linked to a chord is linked to each of its header tasks too, not only
    to its body (Celery's flag, read when the errback is linked)."""
    task_time_limit: float | None = None
    """Hard time limit (seconds) of tasks that set none: the prefork pool kills the child
    and fails the task with ``TimeLimitExceeded``. The solo pool enforces no limits, the
    threads pool only soft ones."""
    task_soft_time_limit: float | None = None
    """Soft time limit (seconds) of tasks that set none: ``SoftTimeLimitExceeded`` is
    raised inside the task (prefork and threads pools)."""
    task_max_retries: int = 3
    """Default ``max_retries`` of tasks that set none."""
    task_default_retry_delay: float = 180.0
    """Default ``countdown`` (seconds) of ``self.retry()`` for tasks that set no
    ``default_retry_delay``."""
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
    result_extended: bool = False
    """Store the task's name, args, kwargs, worker, retries and queue with its result
    (``AsyncResult.name``, ``.args``, ``.kwargs``...)."""
    result_chord_retry_interval: float = 1.0
    """Seconds between two looks of ``celery.chord_unlock`` at a chord's header, on a
    result backend that completes chords so (Celery's database layout,
    ``db+postgresql://``); other backends count chords and never poll."""

    include: tuple[str, ...] = ()
    """Modules the worker imports at start (where tasks are defined)."""
    imports: tuple[str, ...] = ()
    """Celery's other name for ``include``: imported too."""
    beat_schedule: Mapping[str, Any] = field(default_factory=dict)
    """Periodic tasks, in Celery's form: ``{"name": {"task": "proj.add", "schedule":
    crontab(...) | 30.0 | timedelta(...), "args": (...), "kwargs": {...}, "options":
    {...}}}``; read by ``celeriac beat`` and ``worker -B`` (``celeriac.beat``)."""
    beat_max_loop_interval: float = 5.0
    """Longest sleep of a beat's loop (seconds): how soon it notices entries changed at
    runtime. Celery's 0 means this default."""
    beat_lease_timeout: float = 10.0
    """The leading beat's lease lasts this long (seconds) and is renewed every third of
    it; a beat silent this long is replaced by another one."""
    beat_missed_runs: str = "once"
    """After an outage: ``once`` (one run for all missed windows, Celery's behaviour),
    ``all`` (each window, at most 1,000) or ``skip``; entries may override it with
    ``options={"missed_runs": ...}``."""
    beat_scheduler: str | None = None
    """Where beat's entries come from: None (or Celery's default,
    ``celery.beat:PersistentScheduler``): ``beat_schedule`` and the shared store;
    ``"django_celery_beat.schedulers:DatabaseScheduler"`` (or ``"django"``): also
    django-celery-beat's tables, as the Django admin edits them (``docs/guide/django.md``).
    Any other scheduler is refused."""
    outbox_url: str | None = None
    """The PostgreSQL database whose outbox the relays drain (``postgresql://...``): the
    one ``app.transaction(conn)`` writes to (docs/guide/outbox.md)."""
    outbox_table: str = "celeriac_outbox"
    """The outbox table (``table`` or ``schema.table``), created on first use in the
    transaction's database; its name is also the NOTIFY channel that wakes the relays."""
    worker_outbox: bool = False
    """Run an outbox relay inside the worker (a step), draining ``outbox_url``."""
    outbox_claim: bool = True
    """Relays give each publish a claim the worker checks in the result backend before
    running the task, so a row published twice (a relay killed between the broker's
    confirmation and its delete) runs once."""
    timezone: str | None = None
    """The time zone of crontab schedules (for celeriac beat); None: UTC."""
    enable_utc: bool = True
    """Celery's setting, accepted; schedules use ``timezone`` or UTC either way (Celery
    would fall back to the host's zone when it is off)."""

    worker_concurrency: int | None = None
    """Pool size; ``None`` means the number of CPUs (1 for the solo pool)."""
    worker_prefetch_multiplier: int = 4
    """A worker holds up to ``concurrency x`` this many messages (while ``async def`` tasks
    run, ``concurrency x worker_child_concurrency x`` this many)."""
    worker_pool: str = "prefork"
    """Execution pool: ``prefork`` (child processes fed over pipes), ``threads`` or
    ``solo`` (``-P``)."""
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
    """Prefork children allowed to die with no task running per ``worker_restart_window``
    (a broken import or ``worker_process_init``, no UP, a death while idle); one more
    stops the worker (exit 1) instead of fork-looping. A child that dies while running a
    task is not counted: that death counts against the task's message instead
    (redelivered, dead-lettered after ``task_max_deliveries``). Planned exits (recycling,
    hard time limits, revokes, shutdown) never count."""
    worker_restart_window: float = 10.0
    """The window, in seconds, in which ``worker_max_restarts`` counts children that died
    with no task running."""
    worker_child_concurrency: int = 100
    """``async def`` tasks one prefork child runs at once on its event loop (``-c 2
    --child-concurrency 100``: up to 200 in two processes); the threads pool's loop
    thread runs as many. Sync tasks always run one at a time per child."""
    worker_loop_lag_threshold: float = 0.1
    """An event loop running async tasks that stops turning for longer than this (blocking
    code in a coroutine) is logged with the task that holds it, once per episode."""
    worker_async_kill_grace: float = 1.0
    """Seconds an async task past its hard time limit, or revoked with ``terminate=True``
    (cancelled then, in both cases), has to end before its prefork child is killed; the
    child's other tasks then run again elsewhere, uncounted."""
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
    worker_health_interval: float = 5.0
    """Seconds between touches of ``--health-file`` by the worker's loop."""
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

    worker_remote_control: str | bool = True
    """Answer remote-control commands (``celeriac inspect``/``control``): True, False, or
    ``"read-only"`` (inspect commands only; commands that change the worker are
    refused). Celery's ``worker_enable_remote_control`` sets it."""
    control_signing_key: str | None = None
    """When set, commands are HMAC-SHA256-signed with it and workers refuse unsigned,
    badly signed, stale or replayed ones. Give every worker and caller the same key."""
    control_max_age: float = 30.0
    """Seconds a signed command stays valid (against replays; mind clock skew)."""
    worker_state_db: str | None = None
    """A file where the worker keeps its revoked ids across restarts (``--statedb``)."""
    worker_revoke_max: int = 50_000
    """Revoked ids a worker remembers (the oldest go first); Celery's
    ``CELERY_WORKER_REVOKES_MAX`` environment variable overrides it."""
    worker_revoke_expires: float = 10_800.0
    """Seconds a revoke is remembered (workers, statedb, the shared store); Celery's
    ``CELERY_WORKER_REVOKE_EXPIRES`` environment variable overrides it."""
    worker_mingle_timeout: float = 1.0
    """Longest wait at startup for peers' revoked ids (``Mingle``)."""
    broker_fair_queues: tuple[str, ...] = ()
    """Queues declared fair (Redis and SQLite brokers): their consumers take messages in turn
    across fair keys (``apply_async(fair_key="tenant-42")``; none: the key ``""``), so a
    key that sends 100,000 tasks cannot starve one that sends 10
    (docs/guide/flow-control.md)."""
    worker_deduplicate_successful_tasks: bool = False
    """Celery's: a redelivered message of an ``acks_late`` task whose id already
    succeeded (this worker's memory of its successes, else the result backend) is
    acknowledged without running again (docs/guide/flow-control.md)."""
    worker_direct: bool = False
    """Celery's: each worker also consumes ``<hostname>.dq``, so
    ``apply_async(queue="w1@host.dq")`` reaches that worker alone."""
    security_key: str | None = None
    """Celery's: the PEM private key file that signs task messages (the ``auth``
    serializer; ``app.setup_security()``)."""
    security_key_password: str | None = None
    """Celery's: the password of ``security_key``, if it has one."""
    security_certificate: str | None = None
    """Celery's: the PEM X.509 certificate of ``security_key`` (its issuer and serial
    number name the signer in each message)."""
    security_cert_store: str | None = None
    """Celery's: a directory (or glob) of the PEM certificates whose signatures a worker
    accepts."""
    security_digest: str = "sha256"
    """Celery's: the digest of the RSA-PSS signatures (a ``cryptography`` hash name)."""
    security_hmac_keys: Any = None
    """celeriac's own signing mode, instead of certificates: a mapping of key id ->
    secret (str or bytes, 32 bytes or more). The first key signs; every key listed
    verifies, so during a key rotation two keys are valid: list the new one first on
    every producer and worker, then drop the old one once no message signed with it
    waits in a queue. ``security_digest`` is the HMAC's digest."""

    task_compression: str | None = None
    """Compress task messages' bodies: ``"gzip"`` (zlib), ``"bzip2"`` or ``"lzma"``, as
    kombu names them; the message's ``compression`` header says which. A worker
    decompresses whatever it receives, set or not."""
    result_compression: str | None = None
    """The same for stored results, written as Celery 5.7 writes them (the method named
    in-band); readers decompress whatever they read. Celery's database layout
    (``db+postgresql://``) stores them uncompressed, as Celery's does."""
    max_message_size: int = 64 * 1024 * 1024
    """Bytes. A larger message is refused at publish (``MessageTooLarge``, nothing is
    published), and dead-lettered by a worker that receives one."""

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
    result_backend_transport_options: Mapping[str, str] = field(default_factory=dict)
    """Result-backend-specific options, e.g. ``{"master_name": "mymaster"}`` behind Redis
    Sentinel."""
    inert: Mapping[str, Any] = field(default_factory=dict)
    """Celery settings accepted with no effect here (``config.HARMLESS`` and the settings
    of services celeriac does not have, ``cassandra_*``...), by name: kept so that
    ``app.conf`` reads them back and ``inspect conf`` shows them. Not set directly."""

    def __post_init__(self) -> None:
        self._coerce()
        self._check_formats()
        self._check_numbers()
        if self.beat_max_loop_interval == 0:  # Celery's "the scheduler's default"
            object.__setattr__(self, "beat_max_loop_interval", 5.0)
        self._check_control()
        self._check_messages()

    def _coerce(self) -> None:
        """Celery's documented forms (strings of numbers, lists for tuples, timedeltas
        for seconds) become the field's type here, wherever the values came from."""
        for name, hint in _HINTS.items():
            value = getattr(self, name)
            coerced = coerce(name, hint, value)
            if coerced is not value:
                object.__setattr__(self, name, coerced)

    def _check_formats(self) -> None:
        """The serializers, routing, annotations and default rate limit: their errors
        now, not at the first send."""
        for name in ("task_serializer", "result_serializer"):
            try:
                get_serializer(getattr(self, name))
            except ConfigurationError as exc:
                raise ConfigurationError(f"{name}: {exc}") from None
        try:
            accepted_content_types(self.accept_content)
        except ConfigurationError as exc:
            raise ConfigurationError(f"accept_content: {exc}") from None
        Routing(self)
        if self.task_annotations is not None:
            annotators(self.task_annotations)
        _check_rate("task_default_rate_limit", self.task_default_rate_limit)

    def _check_numbers(self) -> None:
        for name, wrong, must in _LIMITS:
            value = getattr(self, name)
            if wrong(value):
                raise ConfigurationError(f"{name} must be {must}, got {value!r}")
        if self.worker_loop_lag_threshold <= 0 or self.worker_async_kill_grace < 0:
            raise ConfigurationError(
                "worker_loop_lag_threshold must be > 0 and worker_async_kill_grace >= 0")
        if self.events_buffer_limit < 1 or self.events_offline_buffer < 1:
            raise ConfigurationError(
                "events_buffer_limit and events_offline_buffer must be >= 1, got "
                f"{self.events_buffer_limit!r} and {self.events_offline_buffer!r}"
            )

    def _check_messages(self) -> None:
        """The compressions and the largest message."""
        for name in ("task_compression", "result_compression"):
            value = getattr(self, name)
            if value is not None:
                try:
                    compression.content_type(value)
                except ConfigurationError as exc:
                    raise ConfigurationError(f"{name}: {exc}") from None
        if self.max_message_size < 1:
            raise ConfigurationError(
                f"max_message_size must be >= 1, got {self.max_message_size!r}"
            )

    def _check_control(self) -> None:
        mode = self.worker_remote_control
        if isinstance(mode, str) and mode.strip().lower() in ("true", "false", "1", "0",
                                                            "yes", "no", "on", "off"):
            mode = mode.strip().lower() in ("true", "1", "yes", "on")
            object.__setattr__(self, "worker_remote_control", mode)
        if mode not in (True, False, "read-only"):
            raise ConfigurationError(
                f"worker_remote_control must be True, False or 'read-only', got {mode!r}")
        for name in ("control_max_age", "worker_revoke_expires", "worker_mingle_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigurationError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.worker_revoke_max < 1:
            raise ConfigurationError(
                f"worker_revoke_max must be >= 1, got {self.worker_revoke_max!r}")

    # dataclass's own __eq__ and __hash__ compile one expression over every field, half
    # the class's creation at import (about 6 ms of every worker's and producer's start);
    # these compare and hash the same tuple of fields, as dataclass's do.
    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return bool(_values(self) == _values(other))

    def __hash__(self) -> int:
        return hash(_values(self))

    @property
    def backend_url(self) -> str:
        return self.result_backend or self.broker_url.split(";")[0]

    def replace(self, **changes: Any) -> Settings:
        """A copy with these settings changed. Celery's names are read as
        ``celeriac.settings.config`` says: implemented, converted, harmless (a warning) or
        refused; an unknown name raises ``ConfigurationError``."""
        if changes.keys() - _FIELD_NAMES:
            changes = translate(changes, _FIELD_NAMES, "settings")
        return dataclasses.replace(self, **self._merge_inert(changes))

    def _merge_inert(self, changes: dict[str, Any]) -> dict[str, Any]:
        if INERT in changes:
            changes = {**changes, INERT: {**self.inert, **changes[INERT]}}
        return changes

    def update_from(self, obj: object, namespace: str | None = None) -> Settings:
        """A copy with the settings of ``obj`` applied: a mapping, or a module or object
        (its public plain-value attributes), read as Celery's ``config_from_object``
        reads them (``namespace="CELERY"`` for Django's ``CELERY_`` prefix)."""
        source = getattr(obj, "__name__", None) or type(obj).__name__
        values = dict(obj) if isinstance(obj, Mapping) else object_values(obj)
        changes = translate(from_mapping(values, namespace), _FIELD_NAMES, source)
        return dataclasses.replace(self, **self._merge_inert(changes))

    @classmethod
    def from_object(cls, obj: object, namespace: str | None = None) -> Settings:
        """Settings from a mapping, a module or an object; see ``update_from``."""
        return cls().update_from(obj, namespace)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Settings from ``CELERIAC_<NAME>`` variables, e.g. ``CELERIAC_BROKER_URL``. A
        variable named after a Celery setting celeriac does not implement is refused or
        warned about as ``celeriac.settings.config`` says; other ``CELERIAC_`` variables are the
        application's own business."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        celery: dict[str, Any] = {}
        for key, raw in env.items():
            name = key[len(ENV_PREFIX):].lower() if key.startswith(ENV_PREFIX) else ""
            if name in _FIELD_NAMES:
                values[name] = _parse(name, _HINTS[name], raw)
            elif name in CELERY_DEFAULTS:
                celery[name] = raw
        values.update(translate(celery, _FIELD_NAMES, "the environment"))
        return cls(**values)


_FIELD_ORDER = tuple(f.name for f in dataclasses.fields(Settings))
_FIELD_NAMES = frozenset(_FIELD_ORDER)
_values: Callable[[Settings], tuple[Any, ...]] = operator.attrgetter(*_FIELD_ORDER)
_MISSING: Any = object()
_HINTS = typing.get_type_hints(Settings)


def _under_one(value: Any) -> bool:
    return bool(value < 1)


def _not_positive(value: Any) -> bool:
    return bool(value <= 0)


_SCHEDULERS = (None, "celery.beat:PersistentScheduler", "celery.beat.PersistentScheduler",
               "django_celery_beat.schedulers:DatabaseScheduler",
               "django_celery_beat.schedulers.DatabaseScheduler", "django")
"""``beat_scheduler``'s accepted values (``celeriac.beat.django.SCHEDULERS`` and Celery's
default, which asks for nothing)."""

# Each comparison as the check always made it (NaN passes "< 1", fails "not > 0").
_LIMITS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    # (setting, what makes its value wrong, what the error says it must be)
    ("task_default_priority", lambda v: not 0 <= v <= 9, "0-9"),
    ("worker_prefetch_multiplier", _under_one, ">= 1"),
    ("worker_concurrency", lambda v: v is not None and v < 1, ">= 1"),
    ("result_chord_retry_interval", lambda v: not v > 0, "> 0 seconds"),
    ("task_redelivery_delay", lambda v: not 0 <= v <= 3600, "0-3600 seconds"),
    ("task_max_deliveries", _under_one, ">= 1"),
    ("worker_child_concurrency", _under_one, ">= 1"),
    ("worker_lease_timeout", _not_positive, "> 0"),
    ("worker_heartbeat_interval", _not_positive, "> 0"),
    ("worker_health_interval", _not_positive, "> 0"),
    ("beat_max_loop_interval", lambda v: v < 0, ">= 0"),
    ("beat_lease_timeout", _not_positive, "> 0"),
    ("beat_missed_runs", lambda v: v not in ("once", "all", "skip"), "'once', 'all' or 'skip'"),
    ("beat_scheduler", lambda v: v not in _SCHEDULERS, "None, "
     "'django_celery_beat.schedulers:DatabaseScheduler' or 'celery.beat:PersistentScheduler' "
     "(custom beat schedulers are not supported)"),
)
"""The settings checked by value alone, after coercion (so of their field's type)."""


def _check_rate(name: str, value: Any) -> None:
    if value is None:
        return
    try:
        parse_rate(value)
    except ValueError as exc:
        raise ConfigurationError(f"{name}: {exc}") from None


def _parse(name: str, hint: Any, raw: str) -> Any:
    """Turn an environment string into the field's type."""
    if name == "task_routes":
        hint = Mapping[str, str]  # the one form an environment variable can spell
    elif name == "task_queues":
        hint = tuple[str, ...]  # queue names
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


class Conf:
    """``app.conf``: the app's settings read and changed as Celery's ``app.conf`` is
    (attribute or item access, ``update``, ``get``). A change makes a new ``Settings``
    (validated at once: an error names the setting) and swaps it in; after the app is
    finalized too, as Celery allows (``Celeriac.configure`` says what takes effect).
    Celery's harmless settings read back what was set, else Celery's default."""

    __slots__ = ("_app",)

    def __init__(self, app: Celeriac) -> None:
        object.__setattr__(self, "_app", app)

    def _lookup(self, name: str) -> Any:
        settings = self._app.settings
        if name in _FIELD_NAMES:
            return getattr(settings, name)
        if name in settings.inert:
            return settings.inert[name]
        if name in CELERY_DEFAULTS and is_inert(name):
            return CELERY_DEFAULTS[name]
        return _MISSING

    def __getattr__(self, name: str) -> Any:
        value = self._lookup(name)
        if value is not _MISSING:
            return value
        settings = self._app.settings
        if not name.startswith("_") and hasattr(settings, name):
            return getattr(settings, name)  # a derived one (backend_url)
        raise AttributeError(f"no setting {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        self.update({name: value})

    def __getitem__(self, name: str) -> Any:
        value = self._lookup(name)
        if value is _MISSING:
            raise KeyError(name)
        return value

    def __setitem__(self, name: str, value: Any) -> None:
        self.update({name: value})

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._lookup(name) is not _MISSING

    def get(self, name: str, default: Any = None) -> Any:
        value = self._lookup(name)
        return default if value is _MISSING else value

    def update(self, values: Mapping[str, Any] | None = None, /, **changes: Any) -> None:
        self._app.configure(**{**(values or {}), **changes})

    def keys(self) -> list[str]:
        return sorted({*_FIELD_NAMES, *self._app.settings.inert} - {INERT})

    def table(self) -> dict[str, Any]:
        """Every setting and its value (the harmless ones that were set among them)."""
        return {name: self._lookup(name) for name in self.keys()}

    def __repr__(self) -> str:
        return f"<Conf of {self._app!r}>"
