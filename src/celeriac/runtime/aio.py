"""What ``async def`` tasks need wherever they run: time limits thrown into a coroutine,
running one to completion from synchronous code, an event loop, and a watch on its lag.

- ``Guard`` / ``Interruptible``: a soft or hard time limit raises ``SoftTimeLimitExceeded``
  (or ``TimeLimitExceeded``) *at the await the task is suspended in*, so that
  ``try: await x  except SoftTimeLimitExceeded: clean up`` works as it does for a sync task
  under SIGALRM. asyncio can only cancel a task with ``CancelledError``; the wrapper drives
  the task's coroutine itself (as ``await`` would) and, when the guard has an exception
  pending, turns the wake-up ``CancelledError`` into that exception and uncancels the task.
- ``run_sync``: eager mode (``task.apply()``) runs a coroutine to completion.
- ``new_loop``: uvloop where installed.
- ``LagWatch``: a thread that notices when a loop stops turning (blocking code inside a
  coroutine) and logs the task that holds it, once per episode.

Free of worker imports: ``tasks.py`` imports it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Generic, TypeVar

T = TypeVar("T")

logger = logging.getLogger("celeriac.aio")


class Guard:
    """The time limits of one running async task: ``interrupt(exc)`` raises ``exc`` in its
    coroutine at the await it waits in (at once if it has not started yet)."""

    __slots__ = ("ended", "fired", "pending", "task", "waiting")

    def __init__(self) -> None:
        self.task: asyncio.Task[Any] | None = None
        """The asyncio task whose coroutine awaits the ``Interruptible``."""
        self.pending: BaseException | None = None
        self.waiting = False
        """The coroutine is suspended at an await (a wake-up can reach it)."""
        self.fired: BaseException | None = None
        """The last limit that fired (the hard one decides the outcome, see execute)."""
        self.ended = False

    def interrupt(self, exc: BaseException) -> None:
        if self.ended:
            return
        self.fired = exc
        self.pending = exc
        if self.waiting and self.task is not None:
            # Wakes the task; Interruptible sees the CancelledError with ``pending`` set
            # and throws ``exc`` in its place.
            self.task.cancel()

    def wrap(self, coro: Coroutine[Any, Any, T]) -> Interruptible[T]:
        return Interruptible(coro, self)


class Interruptible(Generic[T]):
    """Awaits ``coro`` step by step (as ``await coro`` would), so that a ``Guard`` can
    throw a time-limit exception into it."""

    __slots__ = ("coro", "guard")

    def __init__(self, coro: Coroutine[Any, Any, T], guard: Guard) -> None:
        self.coro = coro
        self.guard = guard

    def __await__(self) -> Generator[Any, Any, T]:
        coro, guard = self.coro, self.guard
        guard.task = asyncio.current_task()
        sent: Any = None
        exc: BaseException | None = guard.pending  # fired before the task first ran
        guard.pending = None
        try:
            while True:
                try:
                    yielded = coro.throw(exc) if exc is not None else coro.send(sent)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
                sent, exc = None, None
                guard.waiting = True
                try:
                    sent = yield yielded
                except GeneratorExit:
                    coro.close()
                    raise
                except BaseException as e:  # forwarded, as await does
                    exc = e
                    if isinstance(e, asyncio.CancelledError) and guard.pending is not None:
                        # Our own wake-up, not a real cancellation: the task goes on
                        # with the limit's exception raised where it waits.
                        exc, guard.pending = guard.pending, None
                        if guard.task is not None:
                            guard.task.uncancel()
                finally:
                    guard.waiting = False
        finally:
            guard.ended = True


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion from synchronous code (eager mode).

    On a fresh loop (``asyncio.run``); from inside a running loop (``apply()`` called by
    async code) in a short-lived thread, since that loop cannot be re-entered.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="celeriac-eager") as ex:
        return ex.submit(asyncio.run, coro).result()


def new_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's when it is installed."""
    try:  # deferred: uvloop is optional
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


Describe = Callable[[asyncio.Task[Any] | None], str | None]
"""What a LagWatch logs of the loop's work: given the asyncio task that holds the loop
(None when a callback outside any task does), the task id(s) and name(s); None when no
task runs (a stall then is the machine's, not a task's: nothing is logged)."""


class LagWatch:
    """Logs when ``loop`` stops turning for more than ``threshold`` seconds, naming the
    task that holds it, once per episode (and how long the episode lasted).

    The loop stamps ``beat`` every ``threshold / 4`` while it is ``active``; a daemon
    thread compares. The thread is what can see a blocked loop at all: a check on the loop
    itself would run only once the blocking call returned. It asks asyncio which task
    the loop is in (``asyncio.current_task(loop)``, a dict read under the GIL).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, threshold: float, describe: Describe,
                 log: logging.Logger = logger, where: str = "event loop") -> None:
        self.loop = loop
        self.threshold = threshold
        self.describe = describe
        self.log = log
        self.where = where
        self.beat = time.monotonic()
        self.active = False
        self.episode: float | None = None
        """While an episode of lag lasts: when the loop last turned before it (monotonic)."""
        self.episodes = 0
        self._generation = 0
        """Bumped by each ``start``: a stamp scheduled before a pause ends its chain."""
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Begin watching (on the loop's thread, with the loop running or about to)."""
        self.beat = time.monotonic()
        self.active = True
        self._generation += 1
        self._tick(self._generation)
        if self._thread is None:
            # A fresh event per thread: ``close`` sets the old one for good, and a thread
            # waiting on a set event would spin.
            self._wake = threading.Event()
            self._thread = threading.Thread(target=self._watch, name="celeriac-lag-watch",
                                            args=(self._wake,), daemon=True)
            self._thread.start()

    def pause(self) -> None:
        """Stop watching (the loop is about to stop: its silence is not lag). From any
        thread: the loop's pending stamp sees it and schedules no other."""
        self.active = False

    def close(self) -> None:
        self.pause()
        self._thread = None
        self._wake.set()

    def _tick(self, generation: int) -> None:
        if not self.active or generation != self._generation:
            return
        now = time.monotonic()
        if self.episode is not None:
            self.log.warning("%s unblocked after %.2fs", self.where, now - self.episode)
            self.episode = None
        self.beat = now
        self.loop.call_later(self.threshold / 4, self._tick, generation)

    def _watch(self, wake: threading.Event) -> None:
        me = threading.current_thread()
        while self._thread is me:
            wake.wait(self.threshold / 4)
            if not self.active or self.episode is not None:
                continue
            lag = time.monotonic() - self.beat
            if lag > self.threshold:
                try:
                    task = asyncio.current_task(self.loop)
                except RuntimeError:  # pragma: no cover - the loop closed meanwhile
                    task = None
                what = self.describe(task)
                if what is None:
                    continue
                self.episode = self.beat  # when it last turned
                self.episodes += 1
                self.log.warning(
                    "%s blocked for more than %.2fs by %s: blocking code in an async "
                    "task (use await, or asyncio.to_thread for blocking calls)",
                    self.where, self.threshold, what)
