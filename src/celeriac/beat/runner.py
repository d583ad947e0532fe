"""``BeatRunner``: a ``Beat`` driven by a worker ``Timer`` (``celeriac beat`` and the
worker's ``-B`` step share it).

Each tick runs in a thread (``asyncio.to_thread``): the store and the broker are
reached with blocking clients, and the worker's loop must go on with heartbeats, acks
and signals meanwhile. The next tick is scheduled when this one returns, after the
delay it asked for, so ticks never overlap. A tick that fails (the store unreachable)
is logged once per outage and retried after a second, doubling up to the lease renewal
interval: while the store cannot be reached nothing can be claimed, so nothing is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import TYPE_CHECKING

from ..worker.timer import Entry, Timer
from .django import create_beat
from .service import Beat

if TYPE_CHECKING:
    from ..app import Celeriac

logger = logging.getLogger("celeriac.beat.runner")


class BeatRunner:
    def __init__(self, beat: Beat, timer: Timer) -> None:
        self.beat = beat
        self.timer = timer
        self.stopped = False
        self.failures = 0
        self._next: Entry | None = None
        self._running: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._next = self.timer.call_after(0, self._tick)

    async def _tick(self) -> None:
        if self.stopped:
            return
        self._running = asyncio.current_task()
        try:
            delay = await asyncio.to_thread(self.beat.tick)
        except Exception as exc:
            self.failures += 1
            if self.failures == 1:
                logger.warning("beat tick failed (%s: %s); retrying quietly",
                               type(exc).__name__, exc)
            delay = min(2.0 ** (self.failures - 1), self.beat.renew_interval)
        else:
            if self.failures:
                logger.warning("beat works again after %d failed tick(s)", self.failures)
            self.failures = 0
        if not self.stopped:
            self._next = self.timer.call_after(delay, self._tick)

    async def stop(self) -> None:
        self.stopped = True
        if self._next is not None:
            self._next.cancel()
        running = self._running
        if running is not None and not running.done() and running is not asyncio.current_task():
            # Let the tick in hand finish: its claims and sends belong together.
            with contextlib.suppress(Exception):
                await asyncio.shield(running)
        await asyncio.to_thread(self.beat.close)


async def run_standalone(app: Celeriac, max_interval: float | None = None) -> int:
    """``celeriac beat``: run until SIGINT or SIGTERM, then give the lease up."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    beat = create_beat(app, max_interval=max_interval)
    runner = BeatRunner(beat, Timer(loop))
    logger.warning("beat %s starting: store %s, lease %gs", beat.id, beat.store.safe_url,
                   beat.lease_timeout)
    runner.start()
    await stop.wait()
    await runner.stop()
    logger.warning("beat %s stopped (%d sent)", beat.id, beat.sent)
    return 0
