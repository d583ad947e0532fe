"""``ClusterState``: the picture of workers and tasks that a stream of events paints.

Events arrive late, twice, or out of order (batches from several workers interleave, a
receiver joins mid-stream). The rules:

- Order. Between two events of one sender the Lamport clock decides (ties: the
  timestamp). Clocks of different senders are not comparable (workers do not exchange
  clocks), so between senders the timestamp decides.
- A task never moves back from a final state (SUCCESS, FAILURE, REVOKED, REJECTED) to a
  running one: a late ``task-started`` after ``task-succeeded`` only fills in fields
  that are still empty (and its own timestamp, ``started``). ``task-sent`` (PENDING)
  never replaces what a worker reported.
- ``task-progress`` (a running task's ``update_state``) sets the task's state to the
  custom one it names, as a running state: it never ends the task (a state named like a
  final one is kept in ``progress`` only), the task's final event replaces it, and a
  late one after the final event leaves the state alone. ``progress`` holds the newest
  meta by the same ordering, ``progressed`` its timestamp. Custom states are not
  counted in ``stats()``'s totals (tasks may name any number of them).
- A worker is alive while its last sign of life (an event's ``local_received``, else
  its ``timestamp``) is at most ``freq * 2`` seconds old by this state's clock, and it
  has not said ``worker-offline``. A restarted worker (new pid, or ``worker-online``)
  starts over, although its clock restarted from 0.

Memory is bounded: ``tasks`` is an LRU of ``max_tasks_in_memory`` (most recently
updated last), ``workers`` of ``max_workers_in_memory``. Nothing expires by itself
(monitors show dead workers); ``forget_workers(after)`` drops the workers dead for
longer than ``after`` seconds, which is what the workers' own live set does so that
hostnames seen once (a burst of fake events) do not stay. Totals, throughput and
runtime statistics count every event, evicted tasks included. Applying an event costs
the same however many workers and tasks are known. Not thread-safe: apply events and
read in one thread (the receiver's loop).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, TypeGuard

import orjson

from .. import states
from .dispatcher import Event
from .stats import TaskStats

REJECTED = "REJECTED"
READY_STATES = frozenset({states.SUCCESS, states.FAILURE, states.REVOKED, REJECTED})

# event type -> (state, the TaskState attribute holding that event's timestamp)
TASK_EVENTS: dict[str, tuple[str, str]] = {
    "task-sent": (states.PENDING, "sent"),
    "task-received": (states.RECEIVED, "received"),
    "task-started": (states.STARTED, "started"),
    "task-succeeded": (states.SUCCESS, "succeeded"),
    "task-failed": (states.FAILURE, "failed"),
    "task-retried": (states.RETRY, "retried"),
    "task-rejected": (REJECTED, "rejected"),
    "task-revoked": (states.REVOKED, "revoked"),
}
PROGRESS = "task-progress"
TASK_FIELDS = ("name", "args", "kwargs", "result", "exception", "traceback", "runtime",
               "retries", "eta", "expires", "queue", "root_id", "parent_id", "reason")
DEFAULT_FREQ = 2.0
WORKER_FIELDS = ("freq", "active", "processed", "loadavg", "sw_ident", "sw_ver", "sw_sys")


@dataclass(slots=True, eq=False)
class WorkerState:
    hostname: str
    pid: int | None = None
    freq: float = DEFAULT_FREQ
    last_heartbeat: float | None = None
    clock: int = 0
    active: int = 0
    processed: int = 0
    loadavg: list[float] = field(default_factory=list)
    sw_ident: str | None = None
    sw_ver: str | None = None
    sw_sys: str | None = None
    offline: bool = False
    """It said ``worker-offline`` (``alive`` is also false when its heartbeats stopped)."""
    now: Callable[[], float] = field(default=time.time, repr=False)
    key: tuple[int, float] = field(default=(0, 0.0), repr=False)

    @property
    def heartbeat_expires(self) -> float | None:
        return None if self.last_heartbeat is None else self.last_heartbeat + self.freq * 2

    @property
    def alive(self) -> bool:
        return self.alive_at(self.now())

    def alive_at(self, now: float) -> bool:
        """``alive`` at ``now`` (one reading of the clock for many workers)."""
        return not self.offline and self.last_heartbeat is not None \
            and now <= self.last_heartbeat + self.freq * 2

    @property
    def status(self) -> str:
        return "online" if self.alive else "offline"

    def as_dict(self) -> dict[str, Any]:
        return {"hostname": self.hostname, "pid": self.pid, "freq": self.freq,
                "last_heartbeat": self.last_heartbeat, "clock": self.clock,
                "active": self.active, "processed": self.processed,
                "loadavg": list(self.loadavg), "sw_ident": self.sw_ident,
                "sw_ver": self.sw_ver, "sw_sys": self.sw_sys, "alive": self.alive,
                "status": self.status}


@dataclass(slots=True, eq=False)
class TaskState:
    uuid: str
    name: str | None = None
    state: str = states.PENDING
    worker: str | None = None
    client: str | None = None
    """The hostname that sent ``task-sent``."""
    args: str | None = None
    kwargs: str | None = None
    result: str | None = None
    exception: str | None = None
    traceback: str | None = None
    runtime: float | None = None
    retries: int | None = None
    eta: str | None = None
    expires: str | None = None
    queue: str | None = None
    root_id: str | None = None
    parent_id: str | None = None
    reason: str | None = None
    sent: float | None = None
    received: float | None = None
    started: float | None = None
    succeeded: float | None = None
    failed: float | None = None
    retried: float | None = None
    rejected: float | None = None
    revoked: float | None = None
    progress: Any = None
    """The meta of the newest ``task-progress`` (JSON, or a short repr of it)."""
    progressed: float | None = None
    """The timestamp of that ``task-progress``."""
    timestamp: float | None = None
    """When the current state was entered (the sender's clock)."""
    clock: int = 0
    origin: str | None = field(default=None, repr=False)
    """Who sent the event that set the current state (its clock orders the next ones)."""
    progress_key: tuple[str | None, int, float] | None = field(default=None, repr=False)
    """(origin, clock, timestamp) of the ``task-progress`` that set ``progress``."""

    @property
    def ready(self) -> bool:
        return self.state in READY_STATES

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _TASK_PUBLIC}


_TASK_PUBLIC = tuple(f.name for f in fields(TaskState)
                     if f.name not in ("origin", "progress_key"))


class ClusterState:
    """Workers and tasks as events describe them; ``event()`` applies one event."""

    def __init__(self, *, max_tasks_in_memory: int = 10_000,
                 max_workers_in_memory: int = 5_000,
                 clock: Callable[[], float] = time.time) -> None:
        if max_tasks_in_memory < 1 or max_workers_in_memory < 1:
            raise ValueError("max_tasks_in_memory and max_workers_in_memory must be >= 1")
        self.max_tasks_in_memory = max_tasks_in_memory
        self.max_workers_in_memory = max_workers_in_memory
        self.clock = clock
        self.clear()

    def clear(self) -> None:
        self.workers: OrderedDict[str, WorkerState] = OrderedDict()
        self.tasks: OrderedDict[str, TaskState] = OrderedDict()
        self.event_count = 0
        self.task_count = 0
        """Distinct tasks seen since the start (or ``clear()``), evicted ones included."""
        # Indexes: key -> uuids in update order (a dict is an ordered set).
        self._by_type: dict[str, dict[str, None]] = {}
        self._by_worker: dict[str, dict[str, None]] = {}
        self._by_state: dict[str, dict[str, None]] = {}
        self._types: set[str] = set()
        self._stats = TaskStats()
        self.beat_leader: str | None = None
        """The beat that said last that it leads (``beat-leader``), while it does."""
        self.beat_sent: dict[str, Event] = {}
        """The last ``beat-sent`` event of each beat entry."""

    # -- applying events ----------------------------------------------------------------
    def event(self, event: Event) -> None:
        self.event_count += 1
        if self._stats.started_at is None:
            self._stats.started_at = self.clock()
        type_ = event.get("type")
        if not isinstance(type_, str):
            return
        if type_.startswith("task-"):
            self._task_event(type_, event)
        elif type_.startswith("worker-"):
            self._worker_event(type_[7:], event)
        elif type_ == "beat-sent" and isinstance(event.get("entry"), str):
            self.beat_sent[event["entry"]] = event
        elif type_ == "beat-leader" and isinstance(event.get("beat"), str):
            if event.get("leading"):
                self.beat_leader = event["beat"]
            elif self.beat_leader == event["beat"]:
                self.beat_leader = None

    def _worker(self, hostname: str) -> WorkerState:
        worker = self.workers.get(hostname)
        if worker is None:
            worker = self.workers[hostname] = WorkerState(hostname, now=self.clock)
            while len(self.workers) > self.max_workers_in_memory:
                self.workers.popitem(last=False)
        else:
            self.workers.move_to_end(hostname)
        return worker

    def _worker_event(self, subject: str, event: Event) -> None:
        hostname = event.get("hostname")
        if not isinstance(hostname, str):
            return
        worker = self._worker(hostname)
        key = (_int(event.get("clock")), _float(event.get("timestamp")))
        pid = event.get("pid")
        if subject != "online" and pid == worker.pid and key < worker.key:
            return  # an older event of this process: what we have is newer
        worker.key, worker.pid, worker.clock = key, pid, key[0]
        for name in WORKER_FIELDS:
            if name in event:
                setattr(worker, name, event[name])
        if not (_number(worker.freq) and worker.freq > 0):
            # ``alive`` computes with it: a bad one would make each judgement raise.
            worker.freq = DEFAULT_FREQ
        if subject == "offline":
            worker.offline = True
        else:
            worker.offline = False
            self._sign_of_life(worker, event)

    @staticmethod
    def _sign_of_life(worker: WorkerState, event: Event) -> None:
        seen = event.get("local_received") or event.get("timestamp")
        if isinstance(seen, int | float) and (worker.last_heartbeat is None
                                              or seen > worker.last_heartbeat):
            worker.last_heartbeat = float(seen)

    def _task_event(self, type_: str, event: Event) -> None:
        uuid = event.get("uuid")
        if not isinstance(uuid, str):
            return
        task = self._task(uuid)
        hostname = event.get("hostname")
        hostname = hostname if isinstance(hostname, str) else None
        clock, timestamp = _int(event.get("clock")), _float(event.get("timestamp"))
        old_name, old_worker, old_state = task.name, task.worker, task.state
        new_state = _reported_state(task, type_, event, hostname, clock, timestamp)
        if new_state is not None and _advances(task, new_state, hostname, clock, timestamp):
            task.state, task.timestamp, task.clock, task.origin = (
                new_state, timestamp, clock, hostname)
            _update(task, type_, event, hostname)
        else:  # an older event, or one that sets no state: fill in what is missing
            _fill_in(task, type_, event, hostname)
        if type_ == "task-sent":
            task.client = hostname
        elif hostname is not None:
            worker = self._worker(hostname)
            if not worker.offline:
                self._sign_of_life(worker, event)
        self._index(task, old_name, old_worker, old_state)
        self._count(type_, task, old_state, event)

    def _task(self, uuid: str) -> TaskState:
        """The task ``uuid`` (made if new), now the most recently updated."""
        task = self.tasks.get(uuid)
        if task is None:
            task = self.tasks[uuid] = TaskState(uuid)
            self.task_count += 1
            while len(self.tasks) > self.max_tasks_in_memory:
                self._evict(self.tasks.popitem(last=False)[1])
        else:
            self.tasks.move_to_end(uuid)
        return task

    def _count(self, type_: str, task: TaskState, old_state: str, event: Event) -> None:
        """The statistics' share of a task event: a change of state (a progress report's
        excepted: custom states are not counted), a finished task's runtime."""
        if task.state != old_state and type_ != PROGRESS:
            self._stats.transition(task.name, task.state, self.clock())
        if type_ in ("task-succeeded", "task-failed") and task.name is not None:
            runtime = event.get("runtime")
            if isinstance(runtime, int | float):
                self._stats.runtime(task.name, float(runtime))

    def _index(self, task: TaskState, old_name: str | None, old_worker: str | None,
               old_state: str) -> None:
        uuid = task.uuid
        for index, old, new in ((self._by_type, old_name, task.name),
                                (self._by_worker, old_worker, task.worker),
                                (self._by_state, old_state, task.state)):
            if old is not None and old != new:
                _discard(index, old, uuid)
            if new is not None:
                bucket = index.setdefault(new, {})
                bucket.pop(uuid, None)
                bucket[uuid] = None  # to the end: the newest
        if task.name is not None:
            self._types.add(task.name)

    def _evict(self, task: TaskState) -> None:
        for index, key in ((self._by_type, task.name), (self._by_worker, task.worker),
                           (self._by_state, task.state)):
            if key is not None:
                _discard(index, key, task.uuid)

    def forget_workers(self, after: float) -> list[str]:
        """Drop the workers whose last sign of life expired (``freq * 2``) more than
        ``after`` seconds ago, offline ones included; returns their hostnames. Costs one
        look at each worker known."""
        deadline = self.clock() - after
        gone = [host for host, w in self.workers.items()
                if w.last_heartbeat is None or w.last_heartbeat + w.freq * 2 < deadline]
        for host in gone:
            del self.workers[host]
        return gone

    # -- queries ----------------------------------------------------------------------------
    def alive_workers(self) -> list[WorkerState]:
        return [w for w in self.workers.values() if w.alive]

    def _select(self, index: dict[str, dict[str, None]], key: str, limit: int | None
                ) -> list[TaskState]:
        out: list[TaskState] = []
        for uuid in reversed(index.get(key, {})):
            if limit is not None and len(out) >= limit:
                break
            out.append(self.tasks[uuid])
        return out

    def tasks_by_type(self, name: str, limit: int | None = None) -> list[TaskState]:
        """Tasks named ``name``, most recently updated first."""
        return self._select(self._by_type, name, limit)

    def tasks_by_worker(self, hostname: str, limit: int | None = None) -> list[TaskState]:
        return self._select(self._by_worker, hostname, limit)

    def tasks_by_state(self, state: str, limit: int | None = None) -> list[TaskState]:
        return self._select(self._by_state, state, limit)

    def task_types(self) -> list[str]:
        return sorted(self._types)

    def state_counts(self) -> dict[str, int]:
        """Tasks in memory per current state."""
        return {state: len(uuids) for state, uuids in self._by_state.items() if uuids}

    def throughput(self) -> tuple[float, float]:
        """(completed tasks per second, over how many seconds): the last 60 s, or since
        the first event when that is more recent."""
        return self._stats.throughput(self.clock())

    def stats(self) -> dict[str, Any]:
        """JSON-able: counts, ``states`` (tasks in memory per state), ``totals``
        (transitions into each state) and ``by_task`` (the same per task name),
        ``throughput`` (SUCCESS + FAILURE per second over ``throughput_window`` s) and
        ``runtime`` per task name (count, sum, max, p50, p95)."""
        return {
            "events": self.event_count,
            "tasks_seen": self.task_count,
            "tasks_in_memory": len(self.tasks),
            "workers": len(self.workers),
            "workers_alive": len(self.alive_workers()),
            "states": self.state_counts(),
            **self._stats.as_dict(self.clock()),
        }

    def snapshot(self, task_limit: int | None = None) -> dict[str, Any]:
        """JSON-able: ``workers`` (by hostname), ``tasks`` (most recently updated
        first, up to ``task_limit``) and ``stats``."""
        tasks: list[dict[str, Any]] = []
        for task in reversed(self.tasks.values()):
            if task_limit is not None and len(tasks) >= task_limit:
                break
            tasks.append(task.as_dict())
        return {"timestamp": self.clock(),
                "workers": [w.as_dict() for w in sorted(self.workers.values(),
                                                        key=lambda w: w.hostname)],
                "tasks": tasks, "stats": self.stats()}


def _reported_state(task: TaskState, type_: str, event: Event, origin: str | None,
                    clock: int, timestamp: float) -> str | None:
    """The state a task event puts the task in (None: it sets none), the event's time
    recorded under its type (``started``...) and a progress report's meta kept."""
    known = TASK_EVENTS.get(type_)
    if known is not None:
        setattr(task, known[1], timestamp)
        return known[0]
    if type_ == PROGRESS:
        return _progress(task, event, origin, clock, timestamp)
    return None


def _update(task: TaskState, type_: str, event: Event, origin: str | None) -> None:
    """The fields of an event that set the task's state, over the task's."""
    for name in TASK_FIELDS:
        if name in event:
            setattr(task, name, event[name])
    if type_ != "task-sent":  # sent by a client: it names no worker
        task.worker = origin


def _fill_in(task: TaskState, type_: str, event: Event, origin: str | None) -> None:
    """The fields of an older event (or one that sets no state) the task lacks."""
    for name in TASK_FIELDS:
        if name in event and getattr(task, name) is None:
            setattr(task, name, event[name])
    if type_ != "task-sent" and task.worker is None:
        task.worker = origin


def _advances(task: TaskState, new: str, origin: str | None, clock: int,
              timestamp: float) -> bool:
    """Does an event putting ``task`` in state ``new`` set its state (else it only
    fills in missing fields)?"""
    current = task.state
    if task.timestamp is None:  # no event has set a state yet
        return True
    if new == states.PENDING:
        return current == states.PENDING and timestamp >= task.timestamp
    if current == states.PENDING:
        return True
    if (new in READY_STATES) != (current in READY_STATES):
        return new in READY_STATES
    if origin is not None and origin == task.origin:
        return (clock, timestamp) >= (task.clock, task.timestamp)
    return timestamp >= task.timestamp


PROGRESS_TEXT = 40
"""Characters of a progress description that is neither a count nor a percentage."""


def describe_progress(meta: Any) -> tuple[str, float | None]:
    """How monitors show a task's progress meta: a text and, when it says how far along
    the task is, a fraction from 0 to 1.

    ``{"done": 40, "total": 100}`` or Celery's common ``{"current": 40, "total": 100}``
    -> ``("40/100", 0.4)``; ``{"percent": 40}`` -> ``("40%", 0.4)``; ``{"progress": x}``
    is a fraction when x is a float from 0 to 1, else a percentage; anything else -> a
    short JSON text (or the repr the worker sent) and no fraction; None -> ``("", None)``.
    """
    if meta is None:
        return "", None
    if isinstance(meta, dict):
        total = meta.get("total")
        for key in ("done", "current"):
            done = meta.get(key)
            if _number(done) and _number(total):
                ratio = done / total if total > 0 else None
                return f"{_count(done)}/{_count(total)}", _clamp(ratio)
        percent = meta.get("percent")
        progress = meta.get("progress")
        if not _number(percent) and _number(progress):
            percent = progress * 100 if isinstance(progress, float) and 0 <= progress <= 1 \
                else progress
        if _number(percent):
            return f"{_count(round(percent, 1))}%", _clamp(percent / 100)
    if isinstance(meta, str):
        text = meta
    else:
        try:
            text = orjson.dumps(meta, option=orjson.OPT_NON_STR_KEYS).decode()
        except TypeError:
            text = repr(meta)
    return (text if len(text) <= PROGRESS_TEXT else text[:PROGRESS_TEXT - 3] + "..."), None


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) \
        and math.isfinite(value)


def _count(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:g}"


def _clamp(ratio: float | None) -> float | None:
    return None if ratio is None else min(max(ratio, 0.0), 1.0)


def _progress(task: TaskState, event: Event, origin: str | None, clock: int,
              timestamp: float) -> str | None:
    """Record a ``task-progress``'s meta if it is the newest (one sender: by clock;
    between senders: by timestamp); return the running state it names, if any."""
    key = task.progress_key
    if key is None:
        newer = True
    elif origin is not None and origin == key[0]:
        newer = (clock, timestamp) >= (key[1], key[2])
    else:
        newer = timestamp >= key[2]
    if newer:
        task.progress, task.progressed = event.get("meta"), timestamp
        task.progress_key = (origin, clock, timestamp)
    state = event.get("state")
    if isinstance(state, str) and state and state not in READY_STATES:
        return state
    return None


def _discard(index: dict[str, dict[str, None]], key: str, uuid: str) -> None:
    bucket = index.get(key)
    if bucket is not None:
        bucket.pop(uuid, None)
        if not bucket:
            del index[key]


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0


def _float(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0
