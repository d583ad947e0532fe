"""Progress reports: what ``Task.update_state`` tells monitors while a task runs.

With task events on (``-E``), the process or thread that executes tasks holds a
``ProgressReporter`` and registers each task it runs in ``RUNNING`` for as long as it
runs. ``update_state`` stores the state in the result backend as always, then looks its
task id up here: a hit hands the state and meta to the reporter, which passes them on to
the worker's main process (a prefork child writes a PROGRESS frame to its result pipe;
the solo pool's thread schedules a call on the loop), where they become a
``task-progress`` event. With task events off nothing is registered, so ``update_state``
pays one dict lookup and no frame is ever written.

Only tasks this executor runs are found: ``update_state(task_id=other)`` for a task that
runs elsewhere stores its state and sends nothing (its own worker cannot know of it).

A tight loop of ``update_state`` must not flood the pipe, the worker's loop or the
monitors, so reports are throttled per task: the first goes at once, then at most one
per ``INTERVAL`` seconds; a report that comes sooner waits (a later one replaces it) and
goes when its time comes, sent by a short-lived flusher thread that exits once nothing
waits. When the task ends, ``end`` sends what still waits before the executor reports
the outcome, so the last state always precedes the task's final event.

This module stays free of worker imports: ``update_state`` imports it in any process.
"""

from __future__ import annotations

import logging
import reprlib
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson

logger = logging.getLogger("celeriac.progress")

INTERVAL = 0.1
"""Seconds between two progress events of one task, at least."""
META_LIMIT = 1024
"""Bytes of JSON: a larger meta (or one JSON cannot hold) travels as a short repr."""
REPR_LIMIT = 256

Send = Callable[[str, str, bytes], None]
"""``send(task_id, state, meta_json)``: hand one report to the worker's main process."""

RUNNING: dict[str, ProgressReporter] = {}
"""Task id -> the reporter of the executor that runs it (only while task events are on)."""

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 80
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 10


def encode_meta(meta: Any) -> bytes:
    """``meta`` as JSON when it is JSON and at most ``META_LIMIT`` bytes, else its
    truncated repr as a JSON string. Never raises: a report must not fail the task."""
    try:
        data = orjson.dumps(meta)
    except (TypeError, ValueError):  # orjson.JSONEncodeError is a TypeError
        data = b""
    if data and len(data) <= META_LIMIT:
        return data
    try:
        # reprlib bounds the work, not only the text: a huge meta is not walked whole.
        text = _repr.repr(meta)
    except Exception:
        text = f"<{type(meta).__name__} object (unrepresentable)>"
    if len(text) > REPR_LIMIT:
        text = text[:REPR_LIMIT - 3] + "..."
    return orjson.dumps(text)


class ProgressReporter:
    """One executor's progress reports, throttled per task (see the module doc).

    ``begin``/``end`` are called by the executor around each task; ``report`` by
    ``update_state``, from any thread. ``send`` is called with the lock held, so a
    report waiting in the flusher never overtakes ``end``'s (nor the outcome after it).
    """

    def __init__(self, send: Send, interval: float = INTERVAL) -> None:
        self._send = send
        self.interval = interval
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._last: dict[str, float] = {}
        """Running task id -> when its last report was sent (monotonic)."""
        self._pending: dict[str, tuple[str, bytes]] = {}
        """Task id -> the newest report that waits for its turn."""
        self._flusher: threading.Thread | None = None
        self.sent = 0
        """Reports handed to ``send`` (tests and debugging)."""

    def begin(self, task_id: str) -> None:
        # No lock: one dict store is atomic, and nobody reports for a task not yet
        # registered. (begin and end run for every task while task events are on.)
        self._last[task_id] = float("-inf")
        RUNNING[task_id] = self

    def end(self, task_id: str) -> None:
        """The task ended: send the report that waits, if any, and forget the task."""
        if RUNNING.get(task_id) is self:
            del RUNNING[task_id]
        if self._flusher is None and not self._pending:
            # Nothing waits and no flusher is sending: the common case, without the lock.
            # (A report racing this from a thread of the task is dropped by the flusher,
            # or arrives after the outcome, where monitors ignore it.)
            self._last.pop(task_id, None)
            return
        with self._lock:
            self._last.pop(task_id, None)
            pending = self._pending.pop(task_id, None)
            if pending is not None:
                self._deliver(task_id, *pending)

    def report(self, task_id: str, state: str, meta: Any) -> None:
        data = encode_meta(meta)  # now: the task may change its meta after the call
        now = time.monotonic()
        with self._lock:
            last = self._last.get(task_id)
            if last is None:
                return  # ended (a thread of the task reporting late)
            if task_id in self._pending or now - last < self.interval:
                self._pending[task_id] = (state, data)
                if self._flusher is None:
                    self._flusher = threading.Thread(target=self._flush, daemon=True,
                                                     name="celeriac-progress")
                    self._flusher.start()
                else:
                    self._wake.notify()
                return
            self._last[task_id] = now
            self._deliver(task_id, state, data)

    def _deliver(self, task_id: str, state: str, data: bytes) -> None:
        try:
            self._send(task_id, state, data)
            self.sent += 1
        except Exception as exc:  # the parent is gone, the loop closed: not the task's fault
            logger.debug("progress of task %s not sent: %r", task_id, exc)

    def _flush(self) -> None:
        """Send waiting reports when their time comes; exit once none waits (a report
        that has to wait later starts a new flusher)."""
        with self._lock:
            while self._pending:
                now = time.monotonic()
                for gone in [t for t in self._pending if t not in self._last]:
                    del self._pending[gone]  # ended meanwhile (see ``end``)
                due = [t for t in self._pending if self._last[t] + self.interval <= now]
                if not due:
                    if not self._pending:
                        break
                    first = min(self._last[t] for t in self._pending) + self.interval
                    self._wake.wait(first - now)  # at most ``interval``
                    continue
                for task_id in due:
                    state, data = self._pending.pop(task_id)
                    self._last[task_id] = now
                    self._deliver(task_id, state, data)
            self._flusher = None
