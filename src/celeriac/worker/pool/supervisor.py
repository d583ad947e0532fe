"""Keeps the prefork pool at strength: reaps exits, replaces children, stops restart storms.

Exits are noticed three ways, whichever comes first: SIGCHLD (when the pool runs in the
main thread), EOF on a child's result pipe, and a tick on the Timer every half second
(which also catches a child that never reports UP within ``worker_proc_alive_timeout``).

The restart-storm guard is for children that die without running anything: a broken
import or ``worker_process_init``, a child that never reports UP, one that dies idle.
Replacing those would fork-loop, so more than ``worker_max_restarts`` of them within
``worker_restart_window`` seconds stop the worker (exit 1) with a clear error. What it
does not count: planned exits (recycling, shrinking, stopping; kills for a hard time
limit, a revoke or a cold stop), and a child that died while running a job (a sync job,
async jobs in flight, a job in limbo). That death is the job's doing, and it already
counts against the job's message: redelivered, then dead-lettered after
``task_max_deliveries``. Counting it here too let a burst of poison messages (tasks that
``os._exit``) stop a worker before their deliveries ran out.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import signal
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .children import ChildProc
    from .prefork import PreforkPool

logger = logging.getLogger("celeriac.worker.pool.supervisor")

TICK = 0.5


def describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"was killed by signal {sig} ({name})"
    if os.WIFEXITED(status):
        return f"exited with code {os.WEXITSTATUS(status)}"
    return f"ended with status {status}"


class Supervisor:
    def __init__(self, pool: PreforkPool) -> None:
        self.pool = pool
        s = pool.app.settings
        self.alive_timeout = s.worker_proc_alive_timeout
        self.max_restarts = s.worker_max_restarts
        self.window = s.worker_restart_window
        self.restarts: collections.deque[float] = collections.deque()
        self._reap_scheduled = False
        self._sigchld = False

    def start(self) -> None:
        loop = self.pool.loop
        try:
            loop.add_signal_handler(signal.SIGCHLD, self.reap_soon)
            self._sigchld = True
        except (RuntimeError, ValueError):
            pass  # not the main thread: the tick and pipe EOFs still catch every exit
        self.tick_entry = self.pool.clock.call_repeatedly(TICK, self.tick)

    def stop(self) -> None:
        self.tick_entry.cancel()
        if self._sigchld:
            self.pool.loop.remove_signal_handler(signal.SIGCHLD)
            self._sigchld = False

    def reap_soon(self) -> None:
        if not self._reap_scheduled:
            self._reap_scheduled = True
            self.pool.loop.call_soon(self.reap)

    def reap(self) -> None:
        self._reap_scheduled = False
        for proc in list(self.pool.children.values()):
            try:
                pid, status = os.waitpid(proc.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = proc.pid, 0
            if pid:
                self.pool.on_child_exit(proc, status)

    def tick(self) -> None:
        self.reap()
        now = self.pool.loop.time()
        for proc in list(self.pool.children.values()):
            if not proc.up and proc.killed_for is None and now - proc.born > self.alive_timeout:
                logger.error("child %d did not report up within %ss; replacing it",
                             proc.pid, self.alive_timeout)
                proc.killed_for = "no WORKER_UP"
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)

    def allow_restart(self, proc: ChildProc, how: str, in_flight: int = 0) -> bool:
        """Whether the pool may replace ``proc``, which died unplanned; False once this
        death makes a storm (the worker is then stopped). ``in_flight``: the jobs it was
        running, whose messages count the death; a death with any is not counted here."""
        if in_flight:
            return True
        now = time.monotonic()
        self.restarts.append(now)
        while self.restarts and self.restarts[0] < now - self.window:
            self.restarts.popleft()
        if len(self.restarts) <= self.max_restarts:
            return True
        message = (f"pool children died {len(self.restarts)} times within {self.window:g}s "
                   f"with no task running (last: child {proc.pid} {how}); stopping the "
                   f"worker instead of restarting them (worker_max_restarts="
                   f"{self.max_restarts})")
        logger.critical("%s", message)
        self.pool.client.on_fatal(message)
        return False

    async def reap_all(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.pool.children and time.monotonic() < deadline:
            self.reap()
            if self.pool.children:
                await asyncio.sleep(0.01)
