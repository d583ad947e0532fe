"""The worker: one main process running an asyncio loop (the Hub) and a Blueprint of Steps.

``Worker.run()`` blocks until a shutdown signal: SIGTERM or the first SIGINT (Ctrl-C)
asks for a warm shutdown (stop taking messages, give back the prefetched ones, let
running tasks finish, exit 0); SIGQUIT or a second SIGINT asks for a cold one (give back
every message this worker holds, running ones included, and exit at once).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .autoscale import Autoscaler
from .blueprint import Blueprint, Step
from .control import ControlStep
from .gossip import Gossip
from .health import HealthFile
from .heart import EventsStep, Heart
from .mingle import Mingle
from .outbox import OutboxStep
from .pool import POOLS
from .revoked import Revoked, StateDB
from .steps import DEFAULT_STEPS, ConsumerStep, PoolStep, ResultsCleanup

if TYPE_CHECKING:
    from ..app import Celeriac
    from ..events import EventDispatcher
    from .consumer import Consumer
    from .pool.base import Pool
    from .timer import Timer

logger = logging.getLogger("celeriac.worker")


class Worker:
    def __init__(
        self,
        app: Celeriac,
        *,
        hostname: str | None = None,
        concurrency: int | None = None,
        queues: Sequence[str] | None = None,
        pool: str | None = None,
        autoscale: tuple[int, int] | None = None,
        steps: Sequence[type[Step]] | None = None,
        task_events: bool | None = None,
        heartbeat: bool | None = None,
        install_signal_handlers: bool = True,
        gossip: bool = True,
        health_file: str | None = None,
        beat: bool = False,
        statedb: str | None = None,
        mingle: bool = True,
    ) -> None:
        pool = pool or app.settings.worker_pool
        _check_pool(pool, concurrency)
        # Imports include= and autodiscovered modules now: before the pool forks, and
        # before a message names a task only they register.
        app.finalize()
        self.app = app
        self.hostname = hostname or f"celeriac@{socket.gethostname()}"
        self.id = f"{self.hostname}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.pool_name = pool
        self.autoscale = _autoscale(autoscale or _bounds(app.settings.worker_autoscale), pool)
        self.concurrency = _concurrency(app.settings.worker_concurrency, pool, concurrency,
                                        self.autoscale)
        self.queues = list(queues or app.default_queues)
        settings = app.settings
        self.task_events = settings.worker_send_task_events if task_events is None else task_events
        self.heartbeat = settings.worker_enable_heartbeat if heartbeat is None else heartbeat
        self.events: EventDispatcher | None = None
        """Set by ``EventsStep`` while the worker runs, if it sends any events."""
        self.gossip: Gossip | None = None
        """Set by the ``Gossip`` step (``--without-gossip``: None): ``live``, ``election``."""
        self.health_file = health_file
        """``--health-file``: the ``HealthFile`` step touches it while the loop turns."""
        self.blueprint = Blueprint(_steps(app, steps, mingle=mingle, gossip=gossip, beat=beat,
                                          autoscale=self.autoscale is not None,
                                          outbox=app.settings.worker_outbox),
                                   after=STARTS_AFTER)
        self.steps: dict[type[Step], Step] = {}
        self.install_signal_handlers = install_signal_handlers
        self.statedb = statedb
        """``--statedb``: where ``StateDB`` keeps the revoked ids (else worker_state_db)."""
        self.revoked = Revoked()
        """Revoked task ids; ``StateDB`` replaces it with the loaded set at start."""
        self.timer: Timer
        self.pool: Pool
        self.consumer: Consumer
        # Two flags, never replaced: a second Ctrl-C that lands between the first one and
        # the start of the warm stop must not be lost (a replaced future had that window).
        self._stop_requested = asyncio.Event()
        self._cold_requested = asyncio.Event()
        self._interrupts = 0
        self.exit_code = 0
        self.failure: str | None = None
        self.processed = 0
        """Tasks this worker has finished (its consumer counts them)."""
        self._pool_started = False

    def __repr__(self) -> str:
        return f"<Worker {self.hostname} pool={self.pool_name}x{self.concurrency}>"

    def pool_started(self, pool: Pool) -> None:
        self.pool = pool
        self._pool_started = True

    def active_tasks(self) -> int:
        """Tasks in the pool now, running or queued (0 before it starts)."""
        return len(self.pool.running()) if self._pool_started else 0

    def flush_task_events(self) -> None:
        """Send the consumer's pending task events now (before worker-offline)."""
        step = self.steps.get(ConsumerStep)
        # A start that failed before the consumer existed has nothing to flush.
        consumer = getattr(step, "consumer", None) if isinstance(step, ConsumerStep) else None
        if consumer is not None and consumer.events is not None:
            consumer.events.flush()

    # -- running ------------------------------------------------------------------------
    def run(self) -> int:
        """Run until a shutdown signal; returns the process exit code."""
        try:  # deferred: uvloop is optional
            import uvloop
        except ImportError:
            return asyncio.run(self.run_async())
        return uvloop.run(self.run_async())

    async def run_async(self) -> int:
        loop = asyncio.get_running_loop()
        if self.install_signal_handlers:
            self._install_signals(loop)
        self.app.hooks.call("before_worker_start", self)
        await self.blueprint.start(self)
        if self.events is not None:
            self.events.release()  # held by EventsStep until now
        logger.info("%s ready: queues %s, pool %s x%d", self.hostname, ",".join(self.queues),
                    self.pool_name, self.concurrency)
        self.app.hooks.call("after_worker_start", self)
        if self.install_signal_handlers:
            # The process is the worker's own (its signals are): what start-up made lives
            # as long as it does. Out of the collector's sight, a full collection scans
            # only what came since: one over the whole heap stalled the loop for 18 ms,
            # every task arriving meanwhile waiting (docs/speed.md). A pool child does
            # the same.
            gc.freeze()
        await self._stop_requested.wait()
        self.app.hooks.call("before_worker_stop", self)
        if self._cold_requested.is_set():
            await self.blueprint.stop(cold=True)
        else:
            # A second Ctrl-C during the warm stop abandons it for the cold one.
            stopping = loop.create_task(self.blueprint.stop())
            cold = loop.create_task(self._cold_requested.wait())
            done, _ = await asyncio.wait({stopping, cold}, return_when=asyncio.FIRST_COMPLETED)
            cold.cancel()
            if stopping not in done:
                logger.warning("cold shutdown requested during warm shutdown")
                stopping.cancel()
                await asyncio.gather(stopping, return_exceptions=True)
                await self.blueprint.stop(cold=True)
        self.app.hooks.call("after_worker_stop", self)
        self.app.close()
        if self.failure:
            logger.critical("%s stopped: %s", self.hostname, self.failure)
        else:
            logger.info("%s stopped", self.hostname)
        return self.exit_code

    def fail(self, reason: str) -> None:
        """Stop now because a part cannot go on; the process exits with status 1."""
        self.exit_code = 1
        self.failure = reason
        self.shutdown(cold=True)

    def shutdown(self, cold: bool = False) -> None:
        """Ask the running worker to stop (thread-safe within its loop only)."""
        if cold:
            self._cold_requested.set()
        self._stop_requested.set()

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        def interrupt() -> None:
            self._interrupts += 1
            cold = self._interrupts > 1
            logger.warning("%s: %s shutdown", "SIGINT", "cold" if cold else "warm")
            self.shutdown(cold)

        def term() -> None:
            logger.warning("SIGTERM: warm shutdown")
            self._interrupts = max(self._interrupts, 1)
            self.shutdown(False)

        def quit_() -> None:
            logger.warning("SIGQUIT: cold shutdown")
            self.shutdown(True)

        loop.add_signal_handler(signal.SIGINT, interrupt)
        loop.add_signal_handler(signal.SIGTERM, term)
        loop.add_signal_handler(signal.SIGQUIT, quit_)




STARTS_AFTER: dict[type[Step], tuple[type[Step], ...]] = {
    # The health file is touched from right after the Timer until right before it stops:
    # a warm stop waiting for tasks is alive.
    EventsStep: (HealthFile,),
    StateDB: (HealthFile,),
    # Mingle asks the peers before this worker's own ControlStep subscribes (it asks peers
    # only).
    ControlStep: (Mingle,),
    # The dispatcher is up before the consumer sends task events and, stopping in
    # reverse, Heart sends worker-offline after the pool is done; ControlStep answers until
    # the pool and the consumer are stopped.
    PoolStep: (Heart, ControlStep),
    # The revoked set is loaded before any message is taken.
    ConsumerStep: (StateDB,),
    # Gossip starts last and stops first, so a stopping leader resigns at once.
    Gossip: (ResultsCleanup, Autoscaler),
}
"""How the worker's steps are ordered beyond their ``requires``: each starts after the
steps named here that are in its blueprint (none is added for it)."""


def _steps(app: Celeriac, given: Sequence[type[Step]] | None, *, mingle: bool,
           gossip: bool, beat: bool, autoscale: bool, outbox: bool = False
           ) -> list[type[Step]]:
    """The worker's steps, in no particular order (the Blueprint orders them): ``given``,
    else the defaults; with ``outbox`` (``worker_outbox``) an outbox relay; and with
    ``beat`` (``-B``) a beat on this worker's Timer."""
    if given is not None:
        steps = list(given)
    else:
        optional = {Mingle: mingle, Autoscaler: autoscale, Gossip: gossip}
        steps = [*DEFAULT_STEPS, HealthFile, EventsStep, Heart, StateDB, ControlStep,
                 *(step for step, wanted in optional.items() if wanted)]
    if outbox:
        steps.append(OutboxStep)
    if beat:
        # Asked of the app: beat sits above the worker (its step is made of the worker's
        # Step and Timer); it checks the beat's store now. It requires the Timer only, so
        # it starts last, as given, and stops first.
        steps.append(app.beat.worker_step())
    return steps


def _check_pool(pool: str, concurrency: int | None) -> None:
    if pool not in POOLS:
        raise ValueError(f"pool must be one of {sorted(POOLS)}, got {pool!r}")
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency!r}")


def _autoscale(bounds: tuple[int, int] | None, pool: str) -> tuple[int, int] | None:
    """``bounds`` (max, min) checked, or None."""
    if bounds is None:
        return None
    high, low = bounds
    if not 1 <= low <= high:
        raise ValueError(f"autoscale must be (max, min) with 1 <= min <= max, "
                         f"got {bounds!r}")
    if pool != "prefork":
        raise ValueError("autoscale needs the prefork pool")
    return bounds


def _concurrency(setting: int | None, pool: str, given: int | None,
                 autoscale: tuple[int, int] | None) -> int:
    """The pool's size at start: autoscale's minimum, else ``-c``, else the
    ``worker_concurrency`` setting, else 1 for solo and the number of CPUs for the
    others."""
    if autoscale is not None:
        return autoscale[1]
    if given is not None:
        return given
    if setting is not None:
        return setting
    return 1 if pool == "solo" else os.cpu_count() or 1


def _bounds(value: tuple[int, ...] | None) -> tuple[int, int] | None:
    if value is None:
        return None
    if len(value) != 2:
        raise ValueError(f"worker_autoscale must be (max, min), got {value!r}")
    return value[0], value[1]


__all__ = ["Worker"]
