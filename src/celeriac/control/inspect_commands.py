"""Inspect commands: what a worker holds and how it is set up (read-only), in Celery's
reply shapes so Celery's tooling reads them.

A task is shown as Celery's ``Request.info()``: ``id``, ``name``, ``args`` and
``kwargs`` (the producer's reprs: the parent never decodes bodies), ``type``,
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

from ..__about__ import __version__
from ..clients.net import mask_password
from ..settings import Settings
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
    return {
        "id": h["id"], "name": h["task"], "args": h.get("argsrepr"),
        "kwargs": h.get("kwargsrepr"), "type": h["task"], "hostname": state.hostname,
        "time_start": started,
        # At-most-once tasks are acknowledged before they run.
        "acknowledged": task is not None and not task.acks_late,
        "delivery_info": {"exchange": "", "routing_key": job.queue,
                          "priority": h.get("priority"),
                          "redelivered": job.delivery_count > 1},
        "worker_pid": pid,
    }


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
        if name.startswith("celery."):  # the canvas builtins, as Celery hides its own
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
    return [{"name": q, "exchange": {"name": "", "type": "direct"}, "routing_key": q,
             "durable": True, "exclusive": False, "auto_delete": False, "no_ack": False}
            for q in state.worker.queues]


@inspect_command(args=[("with_defaults", bool)],
                 help="The worker's settings (secrets masked); changed ones only unless "
                      "with_defaults.")
def conf(state: ControlState, with_defaults: bool = False) -> Info:
    settings, defaults = state.app.settings, Settings()
    out: Info = {}
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if not with_defaults and value == getattr(defaults, f.name):
            continue
        shown = censor(f.name, value)
        out[f.name] = shown if _plain(shown) else _describe(shown)
    return out


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
