"""Control commands: what an operator changes in running workers. Replies are Celery's
``{"ok": ...}`` / ``{"error": ...}``; a ``ControlError`` raised here becomes the error
reply (the worker's ``ControlStep``), naming the argument at fault."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from ..errors import ControlError
from ..events import EventDispatcher
from .mailbox import error, ok
from .registry import control_command

if TYPE_CHECKING:
    from ..worker.consumer import Consumer
    from ..worker.control import ControlState
    from ..worker.pool.prefork import PreforkPool

logger = logging.getLogger("celeriac.control")

Reply = dict[str, str]


def _consumer(state: ControlState, command: str) -> Consumer:
    consumer = state.consumer
    if consumer is None:
        raise ControlError(f"{command}: this worker is not consuming yet")
    return consumer


def _prefork(state: ControlState, command: str) -> PreforkPool:
    pool = state.prefork_pool
    if pool is None:
        raise ControlError(f"{command}: the {state.worker.pool_name} pool cannot be resized "
                           "(use prefork)")
    if pool.closing:
        raise ControlError(f"{command}: the pool is stopping")
    return pool


@control_command(args=[("task_id", (str, list)), ("terminate", bool), ("signal", (str, int))],
                 help="Do not run these tasks; with terminate, stop a running one (its "
                      "prefork child is killed; an async task is cancelled on its loop).")
def revoke(state: ControlState, task_id: str | list[str], terminate: bool = False,
           signal: str | int | None = None) -> Reply:
    ids = [task_id] if isinstance(task_id, str) else task_id
    if not ids or not all(isinstance(i, str) and i for i in ids):
        raise ControlError("revoke: argument 'task_id' must be a task id or a list of them")
    return state.revoke(ids, terminate, None if signal is None else str(signal))


@control_command(args=[("headers", (dict, list)), ("terminate", bool),
                       ("signal", (str, int))], variadic="headers",
                 help="Do not run tasks whose stamps match HEADERS (name=value ...); with "
                      "terminate, stop running ones.")
def revoke_by_stamped_headers(state: ControlState, headers: dict[str, Any] | list[str],
                              terminate: bool = False, signal: str | int | None = None
                              ) -> Reply:
    if isinstance(headers, list):  # Celery's command-line form: ["name=value", ...]
        pairs: dict[str, Any] = {}
        for item in headers:
            name, sep, value = str(item).partition("=")
            if not sep or not name:
                raise ControlError("revoke_by_stamped_headers: argument 'headers' must be "
                                   f"name=value pairs, got {item!r}")
            pairs[name] = value
        headers = pairs
    if not headers or not all(isinstance(k, str) and k for k in headers):
        raise ControlError("revoke_by_stamped_headers: argument 'headers' must map stamp "
                           "names to values")
    return state.revoke_by_stamped_headers(headers, terminate,
                                           None if signal is None else str(signal))


@control_command(args=[("task_name", str), ("rate_limit", (str, int, float))],
                 help="Set a task's rate limit in this worker (10/s, 100/m, 0: none).")
def rate_limit(state: ControlState, task_name: str, rate_limit: str | int | float | None
               ) -> Reply:
    consumer = _consumer(state, "rate_limit")
    if consumer.limiter.disabled:
        return error("rate_limit: rate limits are disabled on this worker "
                     "(worker_disable_rate_limits)")
    try:
        consumer.limiter.set_rate(task_name, rate_limit)
    except KeyError:
        raise ControlError(f"rate_limit: unknown task {task_name!r}") from None
    except ValueError as exc:
        raise ControlError(f"rate_limit: argument 'rate_limit': {exc}") from None
    return ok("new rate limit set successfully")


@control_command(args=[("task_name", str), ("soft", (int, float)), ("hard", (int, float))],
                 help="Set a task's soft and hard time limits (seconds) in this worker.")
def time_limit(state: ControlState, task_name: str, soft: float | None = None,
               hard: float | None = None) -> Reply:
    task = state.app.tasks.get(task_name)
    if task is None:
        raise ControlError(f"time_limit: unknown task {task_name!r}")
    for name, value in (("soft", soft), ("hard", hard)):
        if value is not None and value < 0:
            raise ControlError(f"time_limit: argument {name!r} must be >= 0, got {value!r}")
    # The parent computes both limits when it hands a job to a child (prefork), so the
    # next job of this task runs with them; running ones keep theirs.
    task.options = dataclasses.replace(task.options, soft_time_limit=soft or None,
                                       time_limit=hard or None)
    logger.info("time limits of %s set to soft=%s hard=%s", task_name, soft, hard)
    return ok("time limits set successfully")


@control_command(args=[("n", int)], help="Add N children to the prefork pool.")
def pool_grow(state: ControlState, n: int = 1) -> Reply:
    if n < 1:
        raise ControlError(f"pool_grow: argument 'n' must be >= 1, got {n!r}")
    pool = _prefork(state, "pool_grow")
    scaler = state.autoscaler
    if scaler is not None:
        scaler.max = max(scaler.max, pool.concurrency + n)
    pool.grow(n)
    return ok("pool will grow")


@control_command(args=[("n", int)], help="Stop N children (idle ones first).")
def pool_shrink(state: ControlState, n: int = 1) -> Reply:
    if n < 1:
        raise ControlError(f"pool_shrink: argument 'n' must be >= 1, got {n!r}")
    pool = _prefork(state, "pool_shrink")
    if pool.concurrency <= 1:
        raise ControlError("pool_shrink: the pool has one child; it cannot shrink")
    scaler = state.autoscaler
    if scaler is not None:
        scaler.min = max(1, min(scaler.min, pool.concurrency - n))
    pool.shrink(n)
    return ok("pool will shrink")


@control_command(args=[("max", int), ("min", int)],
                 help="Set the autoscaler's bounds (--autoscale workers only).")
def autoscale(state: ControlState, max: int, min: int) -> Reply:
    if not 1 <= min <= max:
        raise ControlError(f"autoscale: arguments must be 1 <= min <= max, got max={max!r} "
                           f"min={min!r}")
    scaler = state.autoscaler
    if scaler is None:
        raise ControlError("autoscale: this worker was not started with --autoscale")
    scaler.max, scaler.min = max, min
    return ok(f"autoscale now max={max} min={min}")


@control_command(args=[("queue", str)], help="Start consuming from QUEUE.")
def add_consumer(state: ControlState, queue: str) -> Reply:
    queues = _consumer(state, "add_consumer").queues
    if not queue:
        raise ControlError("add_consumer: argument 'queue' must not be empty")
    if queue in queues:
        return ok(f"already consuming from {queue!r}")
    queues.append(queue)  # the pump's next fetch names it
    logger.info("consuming from %s too", queue)
    return ok(f"add consumer {queue}")


@control_command(args=[("queue", str)], help="Stop consuming from QUEUE.")
def cancel_consumer(state: ControlState, queue: str) -> Reply:
    queues = _consumer(state, "cancel_consumer").queues
    if queue not in queues:
        raise ControlError(f"cancel_consumer: not consuming from {queue!r}")
    if len(queues) == 1:
        raise ControlError(f"cancel_consumer: {queue!r} is this worker's only queue")
    queues.remove(queue)
    logger.info("no longer consuming from %s", queue)
    return ok(f"no longer consuming from {queue}")


@control_command(help="Send task events (as -E).")
def enable_events(state: ControlState) -> Reply:
    w = state.worker
    consumer = _consumer(state, "enable_events")
    if consumer.events is not None:
        return ok("task events already enabled")
    if w.events is None:
        w.events = EventDispatcher(w.app, hostname=w.hostname, groups={"task"})
    elif w.events.groups is not None and "task" not in w.events.groups:
        w.events.groups = {*w.events.groups, "task"}
    consumer.events = state.task_events(w.events)
    consumer.events.loop = asyncio.get_running_loop()
    w.task_events = True
    if state.pool is not None:
        state.pool.task_events = True  # children started from now on add result reprs
    return ok("task events enabled")


@control_command(help="Stop sending task events.")
def disable_events(state: ControlState) -> Reply:
    w = state.worker
    consumer = _consumer(state, "disable_events")
    if consumer.events is None:
        return ok("task events already disabled")
    consumer.events.flush()
    consumer.events = None
    w.task_events = False
    return ok("task events disabled")


@control_command(help="Send a worker-heartbeat event now.")
def heartbeat(state: ControlState) -> Reply:
    step = state.heart
    if step is None or state.worker.events is None:
        raise ControlError("heartbeat: this worker sends no worker events")
    step.send("worker-heartbeat")
    return ok("heartbeat sent")


@control_command(args=[("msg", str)], help="Warm shutdown of the worker.")
def shutdown(state: ControlState, msg: str = "Got shutdown from remote") -> Reply:
    logger.warning("%s", msg)
    # After this reply is queued: the ControlStep sends it before it stops.
    asyncio.get_running_loop().call_soon(state.worker.shutdown, False)
    return ok("shutting down")
