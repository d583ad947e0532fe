"""The worker's Timer: scheduled calls on the event loop, no thread.

``call_repeatedly`` schedules tick *k* at ``start + k * interval`` (monotonic), so it does
not drift however long each call takes; ticks missed while the loop was busy are skipped,
not bunched. A callback that raises is logged and keeps its schedule. Coroutine
callbacks run as tasks; a tick does not start while the previous one is still running.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

logger = logging.getLogger("celeriac.worker.timer")

Callback = Callable[..., Any | Awaitable[Any]]

TICK = 0.0005
"""A wait shorter than this is not waited for: uvloop's timers and clock count whole
milliseconds, so a shorter timer fires at once and the loop would spin until the clock
ticks (a 0.1 ms sleep measured 205 turns of the loop)."""


class Entry:
    """A scheduled call; ``cancel()`` stops it (and its future ticks)."""

    def __init__(self, timer: Timer, fn: Callback, args: tuple[Any, ...]) -> None:
        self.timer = timer
        self.fn = fn
        self.args = args
        self.handle: asyncio.TimerHandle | None = None
        self.running: asyncio.Task[Any] | None = None
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        if self.handle is not None:
            self.handle.cancel()
        self.timer.entries.discard(self)


class Timer:
    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop or asyncio.get_running_loop()
        self.entries: set[Entry] = set()

    def time(self) -> float:
        return self.loop.time()

    def call_at(self, when: float, fn: Callback, *args: Any) -> Entry:
        """Call ``fn(*args)`` at loop time ``when`` (``Timer.time()``'s clock)."""
        entry = Entry(self, fn, args)
        self.entries.add(entry)

        def fire() -> None:
            self.entries.discard(entry)
            self._run(entry)

        entry.handle = self.loop.call_at(when, fire)
        return entry

    def call_after(self, delay: float, fn: Callback, *args: Any) -> Entry:
        return self.call_at(self.time() + delay, fn, *args)

    def call_repeatedly(self, interval: float, fn: Callback, *args: Any,
                        now: bool = False) -> Entry:
        """Call ``fn(*args)`` every ``interval`` seconds until cancelled."""
        if interval <= 0:
            raise ValueError(f"interval must be > 0, got {interval!r}")
        entry = Entry(self, fn, args)
        self.entries.add(entry)
        start = self.time()

        def tick(k: int) -> None:
            if entry.cancelled:
                return
            if entry.running is None or entry.running.done():
                self._run(entry)
            # The next slot after now on the fixed grid: no drift, no catch-up burst.
            nxt = max(k + 1, math.floor((self.time() - start) / interval) + 1)
            entry.handle = self.loop.call_at(start + nxt * interval, tick, nxt)

        entry.handle = self.loop.call_at(start if now else start + interval, tick,
                                         0 if now else 1)
        return entry

    def _run(self, entry: Entry) -> None:
        if entry.cancelled:
            return
        try:
            result = entry.fn(*entry.args)
        except Exception:
            logger.exception("timer callback %s raised", _name(entry.fn))
            return
        if inspect.isawaitable(result):
            entry.running = asyncio.ensure_future(result)
            entry.running.add_done_callback(functools.partial(_report, fn=entry.fn))

    def cancel_all(self) -> None:
        for entry in list(self.entries):
            entry.cancel()


def _report(task: asyncio.Future[Any], fn: Callback) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("timer callback %s raised", _name(fn), exc_info=task.exception())


def _name(fn: Callback) -> str:
    return getattr(fn, "__qualname__", repr(fn))
