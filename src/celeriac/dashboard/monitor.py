"""The dashboard's view of the cluster: events in, state, history and queue lengths out.

All of it runs on the server's event loop thread; ``ClusterState`` is only touched there,
so the HTTP handlers and the metrics collector read a consistent state without locks.
Blocking broker calls (queue lengths) go to a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..events import ClusterState, Event, EventReceiver
from ..events.state import describe_progress
from .stream import Hub

if TYPE_CHECKING:
    from ..app import Celeriac

logger = logging.getLogger("celeriac.dashboard.monitor")

# Task states whose events end a run: counted as finished and, with a runtime, timed.
FINISHED = {"task-succeeded": "SUCCESS", "task-failed": "FAILURE", "task-retried": "RETRY",
            "task-rejected": "REJECTED", "task-revoked": "REVOKED"}
RUNTIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   300.0, math.inf)
# Bounds on what event contents can make us allocate (names come from the wire).
MAX_TASK_NAMES = 1_000
MAX_QUEUES = 200
UPDATE_BATCH = 500


class Throughput:
    """Finished tasks per second for the last ``seconds`` seconds, by local clock.

    Local receipt time, not the event's timestamp: a worker with a skewed clock or a
    buffer flushed late would otherwise write into buckets that are already drawn.
    """

    def __init__(self, seconds: int = 300, clock: Callable[[], float] = time.time) -> None:
        self.seconds = seconds
        self.clock = clock
        self.buckets: deque[list[int]] = deque(maxlen=seconds)  # [second, succeeded, failed]

    def _bucket(self, now: float) -> list[int]:
        second = int(now)
        last = self.buckets[-1][0] if self.buckets else second - 1
        if second - last > self.seconds:
            self.buckets.clear()
            last = second - 1
        for s in range(last + 1, second + 1):  # zero-filled gaps draw as zero, not as a line
            self.buckets.append([s, 0, 0])
        return self.buckets[-1] if self.buckets[-1][0] == second else [second, 0, 0]

    def record(self, succeeded: int = 0, failed: int = 0) -> None:
        bucket = self._bucket(self.clock())
        bucket[1] += succeeded
        bucket[2] += failed

    def series(self, last: int | None = None) -> list[list[int]]:
        self._bucket(self.clock())
        items = list(self.buckets)
        return [list(b) for b in (items[-last:] if last else items)]


class RuntimeHistograms:
    """Cumulative runtime histograms per task name, for ``/metrics``."""

    def __init__(self, buckets: tuple[float, ...] = RUNTIME_BUCKETS) -> None:
        self.bounds = buckets
        self.by_name: dict[str, tuple[list[int], list[float]]] = {}  # counts, [sum]
        self._warned = False

    def observe(self, name: str, seconds: float) -> None:
        entry = self.by_name.get(name)
        if entry is None:
            if len(self.by_name) >= MAX_TASK_NAMES:
                if not self._warned:
                    logger.warning("more than %d task names; runtimes of new names are "
                                   "not recorded", MAX_TASK_NAMES)
                    self._warned = True
                return
            entry = self.by_name[name] = ([0] * len(self.bounds), [0.0])
        counts, total = entry
        for i, bound in enumerate(self.bounds):
            if seconds <= bound:
                counts[i] += 1
                break
        total[0] += seconds

    def cumulative(self) -> Iterable[tuple[str, list[tuple[str, float]], float]]:
        for name, (counts, total) in sorted(self.by_name.items()):
            running = 0
            buckets = []
            for bound, count in zip(self.bounds, counts, strict=True):
                running += count
                buckets.append(("+Inf" if math.isinf(bound) else repr(bound), float(running)))
            yield name, buckets, total[0]


class Monitor:
    """Receives events into ``state``, keeps history, and feeds the SSE hub."""

    def __init__(self, app: Celeriac, state: ClusterState | None = None, *,
                 queues: Iterable[str] = (), flush_interval: float = 0.25,
                 tick_interval: float = 1.0, client_queue_size: int = 64,
                 clock: Callable[[], float] = time.time) -> None:
        self.app = app
        self.state = state if state is not None else ClusterState()
        self.clock = clock
        self.hub = Hub(client_queue_size)
        self.throughput = Throughput(clock=clock)
        self.runtimes = RuntimeHistograms()
        self.finished: Counter[tuple[str, str]] = Counter()  # (name, state) -> count
        self.events_received = 0
        self.bad_events = 0
        self.connected = False
        self.flush_interval = flush_interval
        self.tick_interval = tick_interval
        self.extra_queues = [q for q in queues if q]
        self.seen_queues: set[str] = set()
        self.queue_lengths: dict[str, int | None] = {}
        self._queue_errors: dict[str, str] = {}
        self._queue_refresh: asyncio.Future[None] | None = None
        self._dirty: dict[str, None] = {}  # task uuids changed since the last flush, ordered
        self._tasks: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- events ------------------------------------------------------------------------
    def handle(self, event: Event) -> None:
        """Apply one event; a malformed one is counted and skipped, never fatal."""
        try:
            self.state.event(event)
        except Exception as exc:  # data from the wire must not stop the receiver
            self.bad_events += 1
            logger.debug("skipped an event that could not be applied: %r", exc)
            return
        self.events_received += 1
        kind = event.get("type", "")
        if not isinstance(kind, str) or not kind.startswith("task-"):
            return
        uuid = event.get("uuid")
        if isinstance(uuid, str):
            self._dirty.pop(uuid, None)
            self._dirty[uuid] = None
        queue = event.get("queue")
        if isinstance(queue, str) and queue and queue not in self.seen_queues \
                and len(self.seen_queues) < MAX_QUEUES:
            self.seen_queues.add(queue)
        if kind in FINISHED:
            self._count_finished(kind, event, uuid)

    def _count_finished(self, kind: str, event: Event, uuid: object) -> None:
        task = self.state.tasks.get(uuid) if isinstance(uuid, str) else None
        name = (task.name if task is not None else None) or str(event.get("name") or "unknown")
        if len(self.finished) < MAX_TASK_NAMES * len(FINISHED) \
                or (name, FINISHED[kind]) in self.finished:
            self.finished[name, FINISHED[kind]] += 1
        if kind == "task-succeeded":
            self.throughput.record(succeeded=1)
        elif kind == "task-failed":
            self.throughput.record(failed=1)
        runtime = event.get("runtime")
        if isinstance(runtime, int | float) and math.isfinite(runtime) and runtime >= 0:
            self.runtimes.observe(name, float(runtime))

    async def _receive(self) -> None:
        """Listen forever; reconnect with backoff when the broker goes away."""
        backoff = 0.5
        while True:
            try:
                async with EventReceiver(self.app) as receiver:
                    if not self.connected:
                        logger.info("listening for events")
                    self.connected = True
                    backoff = 0.5
                    handled = 0
                    while True:
                        event = await receiver.get(timeout=1.0)
                        if event is None:
                            continue
                        self.handle(event)
                        handled += 1
                        if handled % 256 == 0:
                            # A steady stream may never suspend inside get(); let the
                            # HTTP handlers run.
                            await asyncio.sleep(0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.connected = False
                logger.warning("event receiver failed (%s: %s); retrying in %.1fs",
                               type(exc).__name__, exc, backoff)
                await asyncio.sleep(backoff)  # backoff between reconnects
                backoff = min(backoff * 2, 10.0)

    # -- fan-out -----------------------------------------------------------------------
    def flush(self) -> None:
        """Send the tasks changed since the last flush to every SSE client, as one message."""
        if not self._dirty:
            return
        uuids = list(self._dirty)
        self._dirty.clear()
        if not self.hub.clients:
            return
        skipped = max(0, len(uuids) - UPDATE_BATCH)
        tasks = [task_summary(t) for u in uuids[skipped:]
                 if (t := self.state.tasks.get(u)) is not None]
        self.hub.publish("tasks", {"tasks": tasks, "skipped": skipped})

    def tick_payload(self) -> dict[str, Any]:
        return {
            "time": self.clock(),
            "workers": self.workers(),
            "counts": self.state.state_counts(),
            "throughput": self.throughput.series(last=10),
            "queues": self.queues_payload(),
            "events": self.events_received,
            "connected": self.connected,
            "task_names": self.state.task_types(),
        }

    async def _pump(self) -> None:
        next_tick = 0.0
        while True:
            await asyncio.sleep(self.flush_interval)  # the coalescing period
            self.flush()
            now = time.monotonic()
            if self.hub.clients and now >= next_tick:
                next_tick = now + self.tick_interval
                self.hub.publish("tick", self.tick_payload())
                self._start_queue_refresh()

    # -- queues ------------------------------------------------------------------------
    def queue_names(self) -> list[str]:
        declared = self.app.default_queues
        rest = sorted((self.seen_queues | set(self.extra_queues)) - set(declared))
        return [*declared, *rest]

    def queues_payload(self) -> list[dict[str, Any]]:
        return [{"name": q, "length": self.queue_lengths.get(q),
                 "error": self._queue_errors.get(q)} for q in self.queue_names()]

    def _read_lengths(self, names: list[str]) -> dict[str, int | str]:
        out: dict[str, int | str] = {}
        for name in names:
            try:
                out[name] = int(self.app.transport.queue_length(name))
            except Exception as exc:  # one bad queue must not hide the others
                out[name] = f"{type(exc).__name__}: {exc}"
        return out

    async def refresh_queues(self, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Read every queue's length (in a thread: transports block) and return them;
        after ``timeout`` seconds, the last lengths read (a broker that is retrying its
        connection must not hang a page or a scrape)."""
        refresh = self._start_queue_refresh()
        # shield: a caller that times out or goes away must not cancel a read that
        # others wait for
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await asyncio.shield(refresh)
        return self.queues_payload()

    def _start_queue_refresh(self) -> asyncio.Future[None]:
        """The refresh under way, or a new one: one broker round at a time."""
        if self._queue_refresh is None or self._queue_refresh.done():
            self._queue_refresh = asyncio.ensure_future(self._refresh())
        return self._queue_refresh

    async def _refresh(self) -> None:
        results = await asyncio.to_thread(self._read_lengths, self.queue_names())
        for name, value in results.items():
            if isinstance(value, int):
                self.queue_lengths[name] = value
                self._queue_errors.pop(name, None)
            else:
                if self._queue_errors.get(name) != value:
                    logger.warning("cannot read the length of queue %r: %s", name, value)
                self.queue_lengths[name] = None
                self._queue_errors[name] = value

    # -- views -------------------------------------------------------------------------
    def workers(self) -> list[dict[str, Any]]:
        return [worker_view(w) for _, w in sorted(self.state.workers.items())]

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self, receive: bool = True) -> None:
        loop = self._loop = asyncio.get_running_loop()
        if receive:
            self._tasks.append(loop.create_task(self._receive(), name="dashboard-receiver"))
        self._tasks.append(loop.create_task(self._pump(), name="dashboard-pump"))

    def end_streams_threadsafe(self) -> None:
        """End every event stream; callable from any thread or a signal handler.

        A server waits for open responses before it runs the app's shutdown, and an event
        stream never ends by itself: the server calls this when it is told to stop.
        """
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.hub.close)

    async def stop(self) -> None:
        self.hub.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._queue_refresh is not None:
            # the thread cannot be interrupted; wait for it briefly so the broker's
            # connection is not closed under it
            with contextlib.suppress(Exception, asyncio.CancelledError, TimeoutError):
                async with asyncio.timeout(2.0):
                    await self._queue_refresh


TIME_FIELDS = ("sent", "received", "started", "succeeded", "failed", "retried", "rejected",
               "revoked", "progressed")


def task_view(task: Any) -> dict[str, Any]:
    """A task as JSON, with ``updated`` (its latest timestamp), ``finished``, and its
    ``progress`` (the meta) as the page shows it: ``progress_text`` (``40/100``) and
    ``progress_ratio`` (0 to 1, or None: no bar)."""
    data: dict[str, Any] = dict(task.as_dict())
    data["progress_text"], data["progress_ratio"] = describe_progress(data.get("progress"))
    stamps = [v for f in TIME_FIELDS if isinstance(v := data.get(f), int | float)]
    data["updated"] = max(stamps) if stamps else None
    ends = [v for f in ("succeeded", "failed", "rejected", "revoked")
            if isinstance(v := data.get(f), int | float)]
    data["finished"] = max(ends) if ends else None
    return data


def task_summary(task: Any) -> dict[str, Any]:
    """A task for lists and live updates: everything but the traceback."""
    data = task_view(task)
    data.pop("traceback", None)
    return data


def worker_view(worker: Any) -> dict[str, Any]:
    data: dict[str, Any] = dict(worker.as_dict())
    data["alive"] = bool(worker.alive)
    data["status"] = worker.status
    return data
