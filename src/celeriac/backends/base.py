"""The result backend interface, the stored result format, and the URL registry.

A stored result is the serialized mapping Celery uses::

    {"task_id", "status", "result", "traceback", "date_done", "retries"}

where a failure's ``result`` is ``{"exc_type", "exc_module", "exc_message"}``.
Backends store opaque bytes plus the content type; encoding and decoding happen here.
``encode`` and ``store_many`` split a store in two, so that the process that ran a task
encodes its result and the worker's main process stores the results of many tasks in one
round trip (then acknowledges their messages).
"""

from __future__ import annotations

import abc
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from .. import serialization, states
from ..clients.schemes import SchemeRegistry
from ..errors import DecodeError, EncodeError
from ..serialization import compression

if TYPE_CHECKING:
    from ..settings import Settings

logger = logging.getLogger("celeriac.backends")
_IGNORING: set[str] = set()
"""Schemes that said once that they ignore ``result_compression``."""


@dataclass(frozen=True, slots=True)
class ResultMeta:
    task_id: str
    state: str
    result: Any
    traceback: str | None = None
    date_done: str | None = None
    retries: int = 0
    extended: dict[str, Any] | None = None
    """With ``result_extended``: the task's ``name``, ``args``, ``kwargs``, ``worker``
    and ``queue``, as Celery stores them."""
    children: list[Any] | None = None
    """What the task sent (its chain's next step, callbacks, tasks it called) as
    Celery's result tuples (``AsyncResult.as_tuple``)."""

    @property
    def ready(self) -> bool:
        return self.state in states.READY_STATES


class Stored(NamedTuple):
    """A result encoded for storage: what ``store_many`` writes."""

    task_id: str
    content_type: str
    data: bytes
    expires_at: float | None
    """Unix time, or None: never expires."""


GROUP_KEY_PREFIX = "celeriac-group-meta-"
"""``GroupResult.save`` stores a group's member ids as the result of the key
``GROUP_KEY_PREFIX + group_id``: an ordinary stored result (state SUCCESS, value
``{"group_id", "results": [ids]}``), so every backend keeps it, and expires it, as it does
task results, and the group id itself never looks like a finished task."""


def tuple_id(node: Any) -> str:
    """The task id of a result tuple ``[[id, parent], children]`` (or a bare id)."""
    while isinstance(node, list | tuple):
        node = node[0]
    return str(node)


def exception_to_dict(exc: BaseException) -> dict[str, Any]:
    cls = type(exc)
    message: Any = list(exc.args) if _jsonable(exc.args) else [str(exc)]
    return {"exc_type": cls.__qualname__, "exc_module": cls.__module__, "exc_message": message}


def _jsonable(value: Any) -> bool:
    if value is None or isinstance(value, (str, int, float, bool)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_jsonable(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _jsonable(v) for k, v in value.items())
    return False


class ResultBackend(abc.ABC):
    scheme: ClassVar[str]
    process_local: ClassVar[bool] = False
    """True when results live in one process's memory (pool children relay to it)."""
    chord_sizes_stored: ClassVar[bool] = False
    """True when producers store each chord's size here (Celery's Redis layout), so a
    header task's message may carry its chord without ``chord_size``."""
    chords_by_unlock: ClassVar[bool] = False
    """True when chords complete as Celery's do on a backend with no atomic counter (its
    database layout): header tasks only store their results, and the producer sends a
    ``celery.chord_unlock`` task that polls them and sends the body (``builtins.py``)."""
    retries_with_request: ClassVar[bool] = False
    """True when a result keeps its retry count only with the rest of the request (name,
    args...: ``encode(extended=...)``), as Celery's layouts do; 0 is read back otherwise."""
    expiry_by_age: ClassVar[bool] = False
    """True when a result carries no expiry of its own (Celery's database layout): who
    reads or cleans decides, by its own ``result_expires`` and the result's age."""
    expires_alone: ClassVar[bool] = False
    """True when the store expires results by itself and keeps no list of them (Celery's
    Redis layout): ``cleanup`` then has nothing to delete and returns 0."""
    network: ClassVar[bool] = True
    """True when a store waits on the network: the worker's event loop hands it to a
    thread rather than stall on it (heartbeats must go on while a server is slow)."""

    compresses: ClassVar[bool] = True
    """False for a layout whose other readers cannot decompress (Celery's database
    tables): ``result_compression`` is then ignored, with a warning, as Celery does."""

    def __init__(self, url: str, settings: Settings) -> None:
        self.url = url
        self.settings = settings
        accept = settings.accept_content
        if "auth" in accept:  # results are never signed (Celery's): take their serializer
            accept = (*accept, settings.result_serializer)
        self.accept = serialization.accepted_content_types(accept)
        self.compression = settings.result_compression if self.compresses else None
        if settings.result_compression and not self.compresses and \
                self.scheme not in _IGNORING:
            _IGNORING.add(self.scheme)
            logger.warning("result_compression=%r is ignored on %s: Celery's readers of "
                           "this layout do not decompress; results are stored as they are",
                           settings.result_compression, self.scheme)

    # -- what each backend implements ---------------------------------------------------
    @abc.abstractmethod
    def store_many(self, items: Sequence[Stored]) -> None:
        """Store encoded results (``encode``); on return every one of them is stored.

        The one write path: ``store`` is a batch of one; the worker stores its batches
        in one round trip or transaction."""

    @abc.abstractmethod
    def _get(self, task_ids: Sequence[str]) -> dict[str, tuple[str, bytes]]:
        """Unexpired stored results for those of ``task_ids`` that have one."""

    @abc.abstractmethod
    def _wait(self, timeout: float) -> None:
        """Return when any result may have changed, or after ``timeout`` seconds."""

    @abc.abstractmethod
    def forget(self, task_id: str) -> None: ...

    @abc.abstractmethod
    def cleanup(self) -> int:
        """Delete expired results; returns how many. Expired chord state (``chord_part``)
        goes too, uncounted."""

    @abc.abstractmethod
    def chord_part(self, group_id: str, task_id: str, size: int) -> bool:
        """Count header task ``task_id`` of chord ``group_id`` (``size`` header tasks) as
        finished. Idempotent per task id: a task counted twice (it ran twice) counts once.
        Returns True to the call whose count reached ``size``, which records its task id as
        the chord's fired flag in the same atomic operation, and again to a later call for
        that same task id: the task that completed the chord ran again, because its first
        run may have died before it sent the body (the body's id is fixed, so the body is
        never lost). Every other call gets False. The chord's parts and flag expire with
        ``result_expires``."""

    def store_part(self, part: Stored, group_id: str, size: int,
                   index: int | None = None) -> bool:
        """Store chord header task ``part``'s result, then count it (``chord_part``):
        stored first, so the count that completes the chord finds every header result.
        A backend that can do both in one round trip does (Redis: one script).
        ``index`` is the task's ``group_index`` (Celery's layout orders parts by it)."""
        self.store_many([part])
        return self.chord_part(group_id, part.task_id, size)

    def ensure_chords_allowed(self) -> None:
        """Raise ``NotImplementedError`` (with the reason) if chords cannot complete with
        this backend; return otherwise (Celery's check, called before sending a chord).
        Every celeriac backend can: each counts header tasks atomically (``chord_part``),
        or, with ``chords_by_unlock``, lets ``celery.chord_unlock`` poll them. A backend
        that could not would override this."""

    def close(self) -> None:
        """Release connections held by this process."""

    # -- shared logic -------------------------------------------------------------------
    def store(self, task_id: str, state: str, result: Any, *, traceback: str | None = None,
              retries: int = 0, properties: Mapping[str, Any] | None = None) -> None:
        self.store_many([self.encode(task_id, state, result, traceback=traceback,
                                     retries=retries, properties=properties)])

    def encode(self, task_id: str, state: str, result: Any, *, traceback: str | None = None,
               retries: int = 0, extended: dict[str, Any] | None = None,
               properties: Mapping[str, Any] | None = None) -> Stored:
        """The result as ``store`` would write it, for ``store_many`` (here or elsewhere).
        ``properties`` are the task message's (``reply_to``, ``correlation_id``): where
        ``rpc://`` sends the result; the backends that store results ignore them."""
        if isinstance(result, BaseException):
            result = exception_to_dict(result)
        meta = {
            "task_id": task_id, "status": state, "result": result, "traceback": traceback,
            "date_done": datetime.now(UTC).isoformat() if state in states.READY_STATES
            else None, "retries": retries,
        }
        if extended:
            meta.update(extended)
        try:
            content_type, data = self._serialize(task_id, meta, extended)
        except EncodeError as exc:
            # The task succeeded but its return value cannot be stored: record why
            # instead of leaving the caller waiting forever.
            meta["status"] = states.FAILURE
            meta["result"] = {"exc_type": "EncodeError", "exc_module": "celeriac.errors",
                              "exc_message": [f"cannot store result: {exc}"]}
            content_type, data = self._serialize(task_id, meta, extended)
        # Past max_message_size a reader would refuse to decompress it: stored as it is,
        # it reads back (readers decompress only what is marked).
        if self.compression and len(data) <= self.settings.max_message_size:
            data = compression.compress_payload(data, self.compression)
        expires = self.settings.result_expires
        return Stored(task_id, content_type, data, time.time() + expires if expires else None)

    def get(self, task_id: str) -> ResultMeta | None:
        return self.get_many([task_id]).get(task_id)

    def get_many(self, task_ids: Sequence[str]) -> dict[str, ResultMeta]:
        return {tid: self._decode(tid, ct, data) for tid, (ct, data) in
                self._get(task_ids).items()}

    def _serialize(self, task_id: str, meta: dict[str, Any],
                   extended: dict[str, Any] | None) -> tuple[str, bytes]:
        """``(content type, bytes)`` of a result's meta, before compression."""
        return serialization.dumps(meta, self.settings.result_serializer)

    def plain(self, data: bytes) -> bytes:
        """A stored payload as it was serialized: decompressed if it says it is
        compressed, whoever wrote it (Celery's marker)."""
        return compression.decompress_payload(data, self.settings.max_message_size)

    def _decode(self, task_id: str, content_type: str, data: bytes) -> ResultMeta:
        meta = serialization.loads(self.plain(data), content_type, self.accept)
        if not isinstance(meta, dict) or "status" not in meta:
            raise DecodeError(f"stored result for {task_id} is malformed")
        extended = {k: meta[k] for k in EXTENDED if k in meta} if "name" in meta else None
        children = meta.get("children")
        return ResultMeta(task_id, meta["status"], meta.get("result"), meta.get("traceback"),
                          meta.get("date_done"), int(meta.get("retries") or 0), extended,
                          children if isinstance(children, list) and children else None)

    def wait_for(self, task_ids: Iterable[str], timeout: float | None,
                 on_ready: Callable[[ResultMeta], None] | None = None, *,
                 since: float | None = None) -> dict[str, ResultMeta]:
        """Block until every one of ``task_ids`` is ready or ``timeout`` passes.

        Returns the ready results seen (fewer than asked on timeout). ``on_ready`` is
        called once per result as it becomes ready (progress bars). ``since``: the
        ``time.monotonic()`` before the tasks were sent, where the caller knows it.
        """
        pending = set(task_ids)
        done: dict[str, ResultMeta] = {}
        deadline = None if timeout is None else time.monotonic() + timeout
        cursor: int | None = None
        if len(pending) > DIRECT_READ:
            cursor, read = self._cursor(), None
        elif since is not None and self._position_before(since):
            # This thread's wait position was taken before the tasks were sent, so their
            # results come after it: the first read can be the wait itself.
            read = self._wait_read(min(1.0 if timeout is None else timeout, 1.0),
                                   list(pending))
        else:
            # The cursor is taken before the first full read, so a result written during
            # it shows up in the next change set: nothing falls between the two.
            cursor, read = self._cursor_and_read(list(pending))
        candidates: list[str] | set[str] = pending
        while True:
            self._collect(candidates, pending, done, on_ready, read)
            if not pending:
                return done
            remaining = 1.0 if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                return done
            if len(pending) <= DIRECT_READ:
                # A few ids (get()'s path): read them again after each wake, in the same
                # round trip as the wait where the backend can, rather than read the
                # change feed first and the results after it.
                candidates = list(pending)
                read = self._wait_read(min(remaining, 1.0), candidates)
                continue
            read = None
            self._wait(min(remaining, 1.0))
            # Waiting for many: let results accumulate briefly so one read collects a
            # batch, instead of competing with the workers for CPU per result.
            time.sleep(min(BATCH_PAUSE, max(remaining, 0)))
            changes = self._changes(cursor) if cursor is not None else None
            if changes is None:
                cursor, candidates = self._cursor(), pending
            else:
                cursor, written = changes
                candidates = {t for t in written if t in pending}

    def _collect(self, candidates: Iterable[str], pending: set[str],
                 done: dict[str, ResultMeta], on_ready: Callable[[ResultMeta], None] | None,
                 read: dict[str, tuple[str, bytes]] | None = None) -> None:
        if read is not None:
            found = [{tid: self._decode(tid, ct, data) for tid, (ct, data) in read.items()}]
        else:
            batch = list(candidates)
            found = [self.get_many(batch[start:start + 500])
                     for start in range(0, len(batch), 500)]
        for metas in found:
            for tid, meta in metas.items():
                if meta.ready and tid in pending:
                    pending.discard(tid)
                    done[tid] = meta
                    if on_ready:
                        on_ready(meta)

    def _cursor_and_read(self, task_ids: Sequence[str]
                         ) -> tuple[int | None, dict[str, tuple[str, bytes]] | None]:
        """``_cursor()``, then ``_get(task_ids)`` if the backend can do both in one round
        trip (None: the caller reads)."""
        return self._cursor(), None

    def _position_before(self, since: float) -> bool:
        """Whether this thread's wait position (``_wait_read``'s) was taken before the
        ``time.monotonic()`` ``since``, recently enough to be worth starting from; no
        backend without a change feed has one."""
        return False

    def _wait_read(self, timeout: float, task_ids: Sequence[str]
                   ) -> dict[str, tuple[str, bytes]] | None:
        """``_wait``, then ``_get(task_ids)`` if the backend can do both in one round
        trip (None: the caller reads)."""
        self._wait(timeout)
        return None

    # A change feed lets ``wait_for`` read only what was written since it last looked,
    # so waiting for N results costs O(N), not O(N^2). Backends without one rescan.
    def _cursor(self) -> int | None:
        """A position in the backend's write order, or None if it keeps none."""
        return None

    def _changes(self, cursor: int) -> tuple[int, list[str]] | None:
        """Ids written after ``cursor`` and the new cursor; None to ask for a rescan."""
        return None


EXTENDED = ("name", "args", "kwargs", "worker", "queue")
"""The fields ``result_extended`` adds (Celery's names)."""

BATCH_PAUSE = 0.005
DIRECT_READ = 64
"""``wait_for`` rereads up to this many pending ids after each wake rather than read the
change feed first. ``_wait`` must then not wake again for what it has already seen."""

BaseKeyValueStoreBackend = ResultBackend
"""Celery's base class of its key-value result backends (Redis among them), under
Celery's name (``isinstance(app.backend, BaseKeyValueStoreBackend)``): celeriac's
backends share one base class, this one. Celery's internals on it (``_apply_chord_incr``,
``get_key_for_task``...) are not provided: chords are counted by ``chord_part``."""

BACKENDS: SchemeRegistry[ResultBackend] = SchemeRegistry("result backend", "result backend", {
    "memory": ("celeriac.backends.memory", "MemoryBackend"),
    "sqlite": ("celeriac.backends.sqlite", "SQLiteBackend"),
    "redis": ("celeriac.backends.redis", "RedisBackend"),
    "rediss": ("celeriac.backends.redis", "RedisBackend"),
    "redis+sentinel": ("celeriac.backends.redis", "RedisBackend"),
    "sentinel": ("celeriac.backends.redis", "RedisBackend"),
    "redis+cluster": ("celeriac.backends.redis_cluster", "RedisClusterBackend"),
    "postgresql": ("celeriac.backends.postgres", "PostgresBackend"),
    "postgres": ("celeriac.backends.postgres", "PostgresBackend"),
    # Celery's SQLAlchemy backend's URL: its celery_taskmeta table (compatibility mode).
    "db+postgresql": ("celeriac.compat.db_results", "CeleryDatabaseBackend"),
    "db+postgres": ("celeriac.compat.db_results", "CeleryDatabaseBackend"),
    "mysql": ("celeriac.backends.mysql", "MySQLBackend"),
    "rpc": ("celeriac.backends.rpc", "RPCBackend"),
    # Celery's SQLAlchemy tables on MySQL/MariaDB (the driver's name is optional).
    **dict.fromkeys(("db+mysql", "db+mysql+pymysql", "db+mysql+mysqldb"),
                    ("celeriac.compat.db_results_mysql", "CeleryMySQLBackend")),
    # django-celery-results' tables through the Django project's DATABASES ("django-db",
    # Celery's name, is "django-db://default").
    "django-db": ("celeriac.backends.django_db", "DjangoBackend"),
}, layouts={
    # Compatibility mode: Celery's celery-task-meta-<id> keys. A kombu-layout broker URL
    # that is also the result backend (no result_backend set) means Celery's results, as a
    # Celery app with that one URL has.
    ("redis", "celery"): ("celeriac.compat.redis_results", "CeleryRedisBackend"),
    ("rediss", "celery"): ("celeriac.compat.redis_results", "CeleryRedisBackend"),
    ("redis", "kombu"): ("celeriac.compat.redis_results", "CeleryRedisBackend"),
    ("rediss", "kombu"): ("celeriac.compat.redis_results", "CeleryRedisBackend"),
})


def register(scheme: str, factory: type[ResultBackend]) -> None:
    """Add a result backend for ``scheme://`` URLs (third-party backends)."""
    BACKENDS.register(scheme, factory)


def known_schemes() -> list[str]:
    return BACKENDS.known()


def backend_class(url: str) -> type[ResultBackend]:
    return BACKENDS.lookup(_with_scheme(url))


def create_backend(url: str, settings: Settings) -> ResultBackend:
    return backend_class(url)(_with_scheme(url), settings)


def _with_scheme(url: str) -> str:
    """Celery's bare ``django-db`` and ``rpc`` as URLs."""
    bare = url.strip()
    return f"{bare}://" if bare in ("django-db", "rpc") else url
