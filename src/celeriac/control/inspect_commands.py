"""Inspect commands: what a worker holds and how it is set up (read-only), in Celery's
reply shapes so Celery's tooling reads them.

A task is shown as Celery's ``Request.info()``: ``id``, ``name``, ``args`` and
``kwargs`` (decoded for the reply when the body is JSON or msgpack, else the producer's
reprs: the parent decodes no body otherwise), ``type``,
``hostname``, ``time_start``, ``acknowledged``, ``delivery_info``, ``worker_pid``.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import resource
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .. import serialization
from ..__about__ import __version__
from ..clients.net import mask_password
from ..protocol import decode_body
from ..serialization import compression
from ..settings import Settings
from ..settings.celery_names import DEFAULTS as CELERY_DEFAULTS
from ..settings.config import INERT, is_inert
from ..settings.report import _describe, censor, installed_clients, mask_url, settings_lines
from .mailbox import ok
from .registry import inspect_command

if TYPE_CHECKING:
    from ..worker.control import ControlState
    from ..worker.execute import Job

Info = dict[str, Any]


def job_info(state: ControlState, job: Job, *, started: float | None = None,
             pid: int | None = None) -> Info:
    h = job.headers
    task = state.app.tasks.get(h["task"])
    args, kwargs = job_arguments(state, job)
    properties = getattr(job, "properties", None) or {}
    priority = properties.get("priority", h.get("priority"))
    return {
        "id": h["id"], "name": h["task"], "args": args, "kwargs": kwargs,
        "type": h["task"], "hostname": state.hostname, "time_start": started,
        # At-most-once tasks are acknowledged before they run.
        "acknowledged": task is not None and not task.acks_late,
        "delivery_info": {"exchange": "", "routing_key": job.queue,
                          "priority": priority if priority is not None else 0,
                          "redelivered": job.delivery_count > 1},
        "worker_pid": pid,
    }


_SAFE_CONTENT = ("application/json", "application/x-msgpack", "application/msgpack")


def job_arguments(state: ControlState, job: Job) -> tuple[Any, Any]:
    """The job's args and kwargs decoded, as Celery 5.5's ``Request.info()`` gives them;
    only on an inspect call (the worker's main process never decodes bodies otherwise),
    and only JSON or msgpack bodies (never unpickled here). Else the producer's reprs."""
    h = job.headers
    fallback = (h.get("argsrepr"), h.get("kwargsrepr"))
    if job.content_type not in _SAFE_CONTENT:
        return fallback
    try:
        s = state.app.settings
        body = job.body
        packed = h.get(compression.HEADER)
        if packed is not None:
            body = compression.decompress(body, packed, s.max_message_size)
        args, kwargs, _ = decode_body(serialization.loads(
            body, job.content_type, serialization.accepted_content_types(s.accept_content)))
    except Exception:  # a body the task itself will report on; show the reprs
        return fallback
    args = list(args)
    if not (_plain(args) and _plain(kwargs)):
        return fallback
    return args, kwargs


def active_jobs(state: ControlState) -> list[tuple[Job, float | None, int | None]]:
    """(job, started at (time.time()), pid) of every job in the pool."""
    any_pool = state.pool
    if any_pool is None:
        return []
    pool = state.prefork_pool
    if pool is None:  # solo: the task runs in this process
        return [(job, None, os.getpid()) for job in any_pool.running()]
    children = pool.children
    loop_now, wall_now = pool.clock.time(), time.time()
    out: list[tuple[Job, float | None, int | None]] = []
    for proc in children.values():
        if proc.job is not None:
            started = wall_now - (loop_now - proc.started) if proc.started else None
            out.append((proc.job, started, proc.pid))
        for seq, job in proc.tasks.items():  # async jobs on its loop
            began = proc.began.get(seq)
            out.append((job, None if began is None else wall_now - (loop_now - began),
                        proc.pid))
        if proc.queued is not None:  # behind the running one, in the child's pipe
            out.append((proc.queued, None, proc.pid))
    return out


@inspect_command(help="Reply pong: the worker's loop is turning.")
def ping(state: ControlState) -> dict[str, str]:
    return ok("pong")


@inspect_command(args=[("safe", bool)], help="Tasks running (or handed to a child).")
def active(state: ControlState, safe: bool = False) -> list[Info]:
    return [job_info(state, job, started=started, pid=pid)
            for job, started, pid in active_jobs(state)]


@inspect_command(args=[("safe", bool)], help="Tasks prefetched, waiting for a free child.")
def reserved(state: ControlState, safe: bool = False) -> list[Info]:
    consumer = state.consumer
    if consumer is None:
        return []
    return [job_info(state, job) for job in consumer.reserved]


@inspect_command(args=[("safe", bool)],
                 help="Tasks with an eta this worker holds (none: they wait in the broker).")
def scheduled(state: ControlState, safe: bool = False) -> list[Info]:
    # Delayed messages live in the broker (architecture decision 6), never here.
    return []


@inspect_command(help="Ids of revoked tasks this worker remembers.")
def revoked(state: ControlState) -> list[str]:
    return list(state.revoked.ids)


@inspect_command(args=[("taskinfoitems", list)], variadic="taskinfoitems",
                 help="Tasks registered in this worker, with these options "
                      "(e.g. rate_limit).")
def registered(state: ControlState, taskinfoitems: list[str] | None = None) -> list[str]:
    out = []
    for name, task in sorted(state.app.tasks.items()):
        if name.startswith(("celery.", "celeriac.")):  # the canvas builtins (Celery's and
            # ours), as Celery hides its own
            continue
        fields = [f"{item}={getattr(task.options, item, None)}" for item in taskinfoitems or ()
                  if getattr(task.options, item, None) is not None]
        out.append(f"{name} [{' '.join(fields)}]" if fields else name)
    return out


@inspect_command(help="Statistics: pool, resource usage, totals, broker, prefetch.")
def stats(state: ControlState) -> Info:
    w = state.worker
    pool = state.pool
    consumer = state.consumer
    children = getattr(pool, "children", None) if pool is not None else None
    s = state.app.settings
    usage = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "broker": broker_info(s.broker_url),
        "clock": str(state.clock.value),
        "pid": os.getpid(),
        "uptime": int(time.time() - state.started),
        "pool": {
            "implementation": w.pool_name,
            "max-concurrency": pool.concurrency if pool is not None else w.concurrency,
            "processes": sorted(children) if children is not None else [os.getpid()],
            "max-tasks-per-child": s.worker_max_tasks_per_child,
            "max-memory-per-child": s.worker_max_memory_per_child,
            "timeouts": [s.task_soft_time_limit or 0, s.task_time_limit or 0],
        },
        "prefetch_count": consumer.prefetch_limit if consumer is not None else 0,
        "rusage": {
            "utime": usage.ru_utime, "stime": usage.ru_stime, "maxrss": usage.ru_maxrss,
            "minflt": usage.ru_minflt, "majflt": usage.ru_majflt,
            "nvcsw": usage.ru_nvcsw, "nivcsw": usage.ru_nivcsw,
            "children_utime": kids.ru_utime, "children_stime": kids.ru_stime,
        },
        "total": dict(consumer.totals) if consumer is not None else {},
        "processed": w.processed,
        "revoked": len(state.revoked),
        "sw_ident": "celeriac", "sw_ver": __version__, "sw_sys": platform.system(),
    }


def broker_info(url: str) -> Info:
    first = url.split(";")[0].strip()
    parts = urlsplit(first)
    try:
        port = parts.port
    except ValueError:
        port = None
    return {"transport": parts.scheme, "hostname": parts.hostname, "port": port,
            "virtual_host": parts.path.lstrip("/") or "/", "userid": parts.username,
            "url": mask_password(first)}


@inspect_command(help="Queues this worker consumes from.")
def active_queues(state: ControlState) -> list[Info]:
    """kombu's ``Queue.as_dict(recurse=True)``, Celery's reply: a direct exchange named
    as ``task_queues`` declares it (else ``task_default_exchange``, else the queue's)."""
    declared = {q.name: q for q in state.app.routing.declared}
    default_exchange = state.app.settings.task_default_exchange
    out: list[Info] = []
    for name in state.worker.queues:
        q = declared.get(name)
        exchange = (q.exchange if q is not None and q.exchange else default_exchange) or name
        key = q.routing_key if q is not None and q.routing_key else name
        out.append({
            "alias": None, "auto_delete": False, "binding_arguments": None, "bindings": [],
            "consumer_arguments": None, "durable": True,
            "exchange": {"arguments": None, "auto_delete": False, "delivery_mode": None,
                         "durable": True, "name": exchange, "no_declare": False,
                         "passive": False, "type": "direct"},
            "exclusive": False, "expires": None, "max_length": None,
            "max_length_bytes": None, "max_priority": None, "message_ttl": None,
            "name": name, "no_ack": False, "no_declare": None, "queue_arguments": None,
            "routing_key": key,
        })
    return out


@inspect_command(args=[("with_defaults", bool)],
                 help="The worker's settings (secrets masked); changed ones only unless "
                      "with_defaults.")
def conf(state: ControlState, with_defaults: bool = False) -> Info:
    """Celery's ``conf``: the settings changed from their defaults (every one with
    ``with_defaults``), the Celery settings accepted here without effect among them
    (``Settings.inert``: as set, or Celery's defaults with ``with_defaults``), and always
    the ones Celery's tooling reads (``ALWAYS_SHOWN``)."""
    settings, defaults = state.app.settings, Settings()
    values: Info = {}
    if with_defaults:
        values.update((n, v) for n, v in CELERY_DEFAULTS.items() if is_inert(n))
    values.update(settings.inert)
    for f in dataclasses.fields(settings):
        if f.name == INERT:
            continue
        value = getattr(settings, f.name)
        if with_defaults or f.name in ALWAYS_SHOWN or value != getattr(defaults, f.name):
            values[f.name] = value
    for name in ALWAYS_SHOWN:
        if name not in values:
            values[name] = CELERY_DEFAULTS.get(name)
    values.setdefault("deprecated_settings", [])  # Celery's key: none here
    out: Info = {}
    for name, value in sorted(values.items()):
        shown = censor(name, value)
        out[name] = shown if _plain(shown) else _describe(shown)
    return out


ALWAYS_SHOWN = ("broker_url", "result_backend", "accept_content", "enable_utc", "timezone",
                "include", "worker_hijack_root_logger", "worker_log_color",
                "broker_heartbeat")
"""Settings ``inspect conf`` shows even at their defaults: those Celery's own replies
carry (its test and worker apps set them), which Celery's tooling reads."""


def _plain(value: Any) -> bool:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


@inspect_command(args=[("ids", list)], variadic="ids",
                 help="Where these tasks are in this worker: active or reserved.")
def query_task(state: ControlState, ids: list[str]) -> dict[str, list[Any]]:
    wanted = set(ids)
    out: dict[str, list[Any]] = {}
    for job, started, pid in active_jobs(state):
        if job.headers["id"] in wanted:
            out[job.headers["id"]] = ["active", job_info(state, job, started=started, pid=pid)]
    consumer = state.consumer
    for job in consumer.reserved if consumer is not None else ():
        if job.headers["id"] in wanted:
            out[job.headers["id"]] = ["reserved", job_info(state, job)]
    return out


@inspect_command(help="Versions and settings for a bug report (secrets masked).")
def report(state: ControlState) -> dict[str, str]:
    s = state.app.settings
    lines = [
        f"software -> celeriac:{__version__} py:{platform.python_version()}",
        f"platform -> system:{platform.system()} arch:{platform.machine()}",
        f"clients  -> {' '.join(installed_clients())}",
        f"broker   -> {mask_url(s.broker_url)}",
        f"results  -> {mask_url(s.backend_url)}",
        "", *settings_lines(s),
    ]
    return ok("\n".join(lines))


@inspect_command(args=[("from_node", str), ("revoked", dict)],
                 help="Mingle: this worker's revoked ids and clock, for a starting peer.")
def hello(state: ControlState, from_node: str, revoked: dict[str, Any] | None = None
          ) -> Info | None:
    if from_node == state.hostname:
        return None
    return {"revoked": state.revoked.as_dict(), "clock": state.clock.forward()}


@inspect_command(help="This worker's Lamport clock.")
def clock(state: ControlState) -> Info:
    return {"clock": state.clock.forward()}
