"""Flow control where a task is sent: unique jobs' locks and concurrency keys.

**Unique jobs** (``@app.task(unique_for=60)``): while a job with the same key (by
default the task's name and its arguments; ``unique_key=lambda args, kwargs: ...``
names it otherwise) is queued or running, ``delay()`` returns that job's
``AsyncResult`` and sends nothing. The lock is a lease in the shared store
(``stores/flow.py``), held by the job's task id for at most ``unique_for`` seconds, and
tied to the message: the worker lets it go as the job starts (``unique_mode=
"until_started"``) or ends (``"until_finished"``, the default), and when the message is
redelivered (its worker died) or dropped (revoked, expired, dead-lettered)
(``worker/limits.py``). A failed publish releases it here (``send``; a workflow's
steps, built or published elsewhere: ``release_unsent``). ``"debounce"``: every call is
sent, delayed by ``unique_for``, and takes the lock from the one before; a worker runs a
debounced message only if it still holds the lock as it comes due, so the last call
within the window runs and the others end ``REVOKED``.

The check is one store round trip per ``delay()`` (``hold``); a task without
``unique_for`` pays one registry lookup.

**Workflow steps** (a chain's step, a callback or errback, a chord's body, a group's or
a chord header's member, sent by a producer or by a worker after a task: ``step``) get
the same check, but a step's id is one its workflow waits for, so a duplicate is not
simply left out: it is sent as a stand-in (``WAIT_TASK``, under the step's id, with what
follows the step) that waits for the holder, polling (a retry every
``result_chord_retry_interval``, no pool slot held meanwhile), and ends with the
holder's result or exception; the workflow goes on from there. If the holder is gone
without a result (``until_started``: it started; its result ignored; its lock lapsed),
the stand-in sends the step itself, checked again. A debounced task is not debounced as
a step: the step superseded would leave its workflow waiting for ever.

**Concurrency keys** (``@app.task(concurrency=2, concurrency_key=lambda a, k:
k["tenant"])``): the key is computed here, where the arguments are, and travels in the
``celeriac_concurrency`` header, since a worker's main process reads headers only.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import orjson

from .. import result as _result
from ..errors import ConfigurationError
from ..protocol import new_id

if TYPE_CHECKING:
    from ..app import Celeriac
    from ..stores import SharedStore
    from .options import SendOptions

logger = logging.getLogger("celeriac.producer.flow")

WAIT_TASK = "celeriac.unique_wait"
"""The stand-in a workflow step is sent as while another job holds its unique lock
(``canvas/builtins.py``): ``(holder, lock, task, args, kwargs, headers)``."""
UNIQUE_HEADER = "celeriac_unique"
"""``[lock name, mode]``: the lock a worker lets go as the job starts or ends."""
CONCURRENCY_HEADER = "celeriac_concurrency"
"""The job's concurrency key (``concurrency_key``), as a string."""
FAIR_HEADER = "celeriac_fair"
"""Its key on a fair queue (``fair_key``); the Redis transport reads it by this name."""
FAIR_KEY_LENGTH = 200
MODES = ("until_finished", "until_started", "debounce")
KEY_LENGTH = 64
"""A unique key longer than this is replaced by its hash in the lock's name."""

Send = Callable[["Celeriac", str, Sequence[Any] | None, Mapping[str, Any] | None,
                 "SendOptions"], "_result.AsyncResult[Any]"]
KeyFn = Callable[[Sequence[Any], Mapping[str, Any]], Any]


@dataclass(frozen=True, slots=True)
class Spec:
    """What a task's flow options ask of a send."""

    unique_for: float | None
    unique_key: KeyFn | None
    mode: str
    concurrency_key: KeyFn | None


def check_options(name: str, options: Mapping[str, Any]) -> None:
    """Refuse bad flow options where the task is declared, naming the option."""
    unique_for = options.get("unique_for")
    if unique_for is not None and (isinstance(unique_for, bool) or
                                   not isinstance(unique_for, (int, float)) or
                                   not unique_for > 0):
        raise ConfigurationError(f"task {name!r}: unique_for must be a number of seconds "
                                 f"> 0, got {unique_for!r}")
    mode = options.get("unique_mode", MODES[0])
    if mode not in MODES:
        raise ConfigurationError(f"task {name!r}: unique_mode must be one of "
                                 f"{', '.join(MODES)}, got {mode!r}")
    concurrency = options.get("concurrency")
    if concurrency is not None and (isinstance(concurrency, bool) or
                                    not isinstance(concurrency, int) or concurrency < 1):
        raise ConfigurationError(f"task {name!r}: concurrency must be an int >= 1, got "
                                 f"{concurrency!r}")
    for option in ("unique_key", "concurrency_key"):
        if options.get(option) is not None and not callable(options[option]):
            raise ConfigurationError(f"task {name!r}: {option} must be callable (args, "
                                     f"kwargs) -> key, got {options[option]!r}")
    if options.get("concurrency_key") is not None and concurrency is None:
        raise ConfigurationError(f"task {name!r}: concurrency_key needs concurrency=")


def spec(app: Celeriac, name: str) -> Spec | None:
    """The flow options of task ``name`` that act where it is sent; None (the common
    case, one registry lookup) when it has none."""
    task = app.tasks.get(name)
    if task is None:
        return None
    o = task.options
    unique_for = getattr(o, "unique_for", None)
    ckey = getattr(o, "concurrency_key", None)
    if unique_for is None and ckey is None:
        return None
    return Spec(unique_for, getattr(o, "unique_key", None),
                getattr(o, "unique_mode", MODES[0]), ckey)


def applied(options: SendOptions) -> bool:
    """Whether ``send`` made these options already (its headers are there)."""
    headers = options.headers
    return headers is not None and (UNIQUE_HEADER in headers or CONCURRENCY_HEADER in
                                    headers or FAIR_HEADER in headers)


def send(app: Celeriac, name: str, args: Sequence[Any] | None,
         kwargs: Mapping[str, Any] | None, options: SendOptions, flow: Spec | None,
         publish: Send) -> _result.AsyncResult[Any]:
    """``publish`` (``publish.send``) with what ``flow`` and the options ask: the fair
    key's and the concurrency key's headers; the unique lock taken first (or the
    holder's result, nothing sent)."""
    a, k = tuple(args or ()), dict(kwargs or {})
    headers = dict(options.headers or {})
    if options.fair_key is not None:
        headers[FAIR_HEADER] = fair_key(app, options)
    if flow is not None and flow.concurrency_key is not None:
        headers[CONCURRENCY_HEADER] = str(flow.concurrency_key(a, k))
    if flow is None or flow.unique_for is None:
        return publish(app, name, args, kwargs, replace(options, headers=headers))
    if _in_workflow(options):  # what follows it waits for its id: a step's rule
        name, args, kwargs, options = _unique_step(app, name, a, k,
                                                   replace(options, headers=headers), flow)
        held = lock_of_step(options)
        try:
            return publish(app, name, args, kwargs, options)
        except BaseException:
            if held is not None:
                _store(app, name).release(held, options.task_id or "")
            raise
    lock = lock_name(name, a, k, flow.unique_key)
    task_id = options.task_id or new_id()
    store = _store(app, name)
    if flow.mode == "debounce":
        _debounce(store, lock, task_id, flow.unique_for)
        if options.countdown is None and options.eta is None:
            options = replace(options, countdown=flow.unique_for)
    else:
        # A task id given again while its job holds the lock is that job, queued or
        # running: nothing more is sent (``hold`` would take it as a renewal).
        held = store.holder(lock) if options.task_id else None
        if held is None:
            held = store.hold(lock, task_id, flow.unique_for)
        if held is not None:
            logger.debug("Task %s[%s] not sent: %s holds its unique lock %s", name, task_id,
                         held, lock)
            return _result.AsyncResult(held, app, name)
    headers[UNIQUE_HEADER] = [lock, flow.mode]
    try:
        return publish(app, name, args, kwargs,
                       replace(options, task_id=task_id, headers=headers))
    except BaseException:
        store.release(lock, task_id)  # nothing was sent: the next call may send
        raise


def step(app: Celeriac, name: str, args: Sequence[Any] | None,
         kwargs: Mapping[str, Any] | None, options: SendOptions
         ) -> tuple[str, Sequence[Any] | None, Mapping[str, Any] | None, SendOptions]:
    """What a workflow step is sent as (``prepare``'s, a worker's follow-up's): the task
    with its concurrency key's header and its unique lock taken, or the stand-in
    (``WAIT_TASK``) under the step's id while another job holds that lock. One registry
    lookup for a task without flow options."""
    flow = spec(app, name)
    if flow is None or applied(options):
        return name, args, kwargs, options
    a, k = tuple(args or ()), dict(kwargs or {})
    if flow.concurrency_key is not None:
        options = replace(options, headers={**(options.headers or {}),
                                            CONCURRENCY_HEADER: str(flow.concurrency_key(a, k))})
    if flow.unique_for is None:
        return name, args, kwargs, options
    return _unique_step(app, name, a, k, options, flow)


def release_unsent(app: Celeriac, messages: Iterable[tuple[str, Mapping[str, Any] | None]]
                   ) -> None:
    """Let go of the unique locks that steps took for messages never published: each
    ``(task id, headers)`` whose headers name a lock (``UNIQUE_HEADER``). Released only
    where that id holds it; a store that cannot be reached now leaves it to lapse after
    ``unique_for`` (logged): the publish's own error is the one the caller sees."""
    held = [(spec_[0], task_id) for task_id, headers in messages
            if isinstance(spec_ := (headers or {}).get(UNIQUE_HEADER), list) and spec_]
    if not held:
        return
    try:
        store = _store(app, "unique_for")
        for lock, task_id in held:
            store.release(lock, task_id)
            logger.debug("Task [%s] not published: its unique lock %s released", task_id,
                         lock)
    except Exception as exc:  # the caller raises the publish's error, not this one
        logger.warning("Unique locks of %d unpublished task(s) (first [%s]) not released: "
                       "%r; they lapse after unique_for", len(held), held[0][1], exc)


def _in_workflow(options: SendOptions) -> bool:
    """Whether something waits for this send's own id (what follows it, or its group)."""
    embed = options.embed
    return options.group_id is not None or (
        embed is not None and any(v is not None for v in embed.values()))


def lock_of_step(options: SendOptions) -> str | None:
    """The unique lock a step's options say it took (None: a stand-in, or no lock)."""
    spec_ = (options.headers or {}).get(UNIQUE_HEADER)
    return spec_[0] if isinstance(spec_, list) and spec_ else None


def _unique_step(app: Celeriac, name: str, a: tuple[Any, ...], k: dict[str, Any],
                 options: SendOptions, flow: Spec
                 ) -> tuple[str, Sequence[Any], Mapping[str, Any], SendOptions]:
    assert flow.unique_for is not None
    task_id = options.task_id or new_id()
    if flow.mode == "debounce":
        logger.debug("Task %s[%s] sent as a workflow step: not debounced", name, task_id)
        return name, a, k, options
    lock = lock_name(name, a, k, flow.unique_key)
    # Its own id holding the lock is this step sent again (its parent ran again): a
    # renewal, so sent again (at least once) rather than lost if the first publish
    # never happened.
    held = _store(app, name).hold(lock, task_id, flow.unique_for)
    headers = dict(options.headers or {})
    if held is None:
        headers[UNIQUE_HEADER] = [lock, flow.mode]
        return name, a, k, replace(options, task_id=task_id, headers=headers)
    logger.info("Task %s[%s]: %s holds its unique lock %s; a stand-in waits for its result",
                name, task_id, held, lock)
    headers.pop(CONCURRENCY_HEADER, None)
    queue = options.queue
    if queue is None and options.routing_key is None and not app.routing.special:
        queue = app.route(name)  # where the step would have gone: its workers
    return WAIT_TASK, (held, lock, name, list(a), k, headers), {}, replace(
        options, task_id=task_id, queue=queue, headers=headers or None)


def awaited(app: Celeriac, holder: str, lock: str, step_id: str) -> str:
    """Where a stand-in for step ``step_id`` stands: ``"sent"`` (the step holds the lock:
    it was sent itself already), ``"done"`` (the holder's result is stored), ``"wait"``
    (the holder holds the lock, no result yet), ``"gone"`` (neither: send the step)."""
    # The lock first: the holder's result is stored before its lock is let go, so a
    # lock gone and no result means none is coming.
    now = _store(app, WAIT_TASK).holder(lock)
    if now == step_id:
        return "sent"
    meta = app.backend.get(holder)
    if meta is not None and meta.ready:
        return "done"
    return "wait" if now == holder else "gone"


def fair_key(app: Celeriac, options: SendOptions) -> str:
    """The ``fair_key`` option checked: a string, for a fair queue when one is named."""
    key = options.fair_key
    if not isinstance(key, str) or len(key) > FAIR_KEY_LENGTH:
        raise ValueError(f"fair_key must be a string of at most {FAIR_KEY_LENGTH} "
                         f"characters, got {key!r}")
    queue = options.queue
    if queue and queue not in app.settings.broker_fair_queues:
        raise ValueError(f"fair_key: queue {queue!r} is not fair (broker_fair_queues: "
                         f"{list(app.settings.broker_fair_queues)})")
    return key


def with_fair(app: Celeriac, options: SendOptions) -> SendOptions:
    """``options`` with the fair key's header (a bulk send's: ``send_many``)."""
    return replace(options, headers={**(options.headers or {}),
                                     FAIR_HEADER: fair_key(app, options)})


def _debounce(store: SharedStore, lock: str, task_id: str, window: float) -> None:
    # The lock outlives the window by as much again: it must still name the last call
    # when that call's message comes due and the worker looks (worker/limits.py).
    before = store.swap(lock, task_id, 2 * window)
    if before is not None:
        logger.debug("Task [%s] debounced by [%s] (%s)", before, task_id, lock)


def lock_name(name: str, args: Sequence[Any], kwargs: Mapping[str, Any],
              key: KeyFn | None) -> str:
    """``unique:<task>:<key>``; the key is the ``unique_key``'s value, else the
    arguments', hashed when long."""
    if key is not None:
        text = str(key(args, kwargs))
    else:
        try:
            text = orjson.dumps([args, kwargs], option=orjson.OPT_SORT_KEYS |
                                orjson.OPT_NON_STR_KEYS).decode()
        except TypeError:  # arguments JSON cannot hold (pickle): their repr
            text = repr((args, sorted(kwargs.items())))
    if len(text) > KEY_LENGTH:
        import hashlib  # deferred: only a long key needs it (a producer's import cost)

        text = hashlib.sha256(text.encode()).hexdigest()
    return f"unique:{name}:{text}"


_stores: weakref.WeakKeyDictionary[Celeriac, tuple[int, object, SharedStore]] = \
    weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _store(app: Celeriac, name: str) -> SharedStore:
    """The app's shared store in this process (made again after a fork, or when the
    app's settings were replaced); ``ConfigurationError`` naming task ``name`` where the
    deployment has none."""
    with _lock:
        held = _stores.get(app)
        if held is not None and held[0] == os.getpid() and held[1] is app.settings:
            return held[2]
        if held is not None and held[0] == os.getpid():
            held[2].close()  # the settings were replaced
        # Deferred: the stores are only for tasks with unique_for or debounce, and a
        # producer's import would otherwise load them all (issue 30).
        from ..stores import store_for

        store = store_for(app.settings, f"task {name!r}: unique_for")
        _stores[app] = (os.getpid(), app.settings, store)
        return store


def close(app: Celeriac) -> None:
    """Close the app's store in this process, if ``send`` opened one (``app.close()``)."""
    with _lock:
        held = _stores.pop(app, None)
    if held is not None and held[0] == os.getpid():
        held[2].close()


__all__ = ["CONCURRENCY_HEADER", "FAIR_HEADER", "MODES", "UNIQUE_HEADER", "WAIT_TASK", "Spec",
           "applied", "awaited", "check_options", "close", "fair_key", "lock_name",
           "lock_of_step", "release_unsent", "send", "spec", "step", "with_fair"]
