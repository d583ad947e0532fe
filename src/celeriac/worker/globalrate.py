"""Global rate limits: one limit per task name shared by every worker of the cluster
(``@app.task(global_rate_limit="50/s")``), beyond Celery's per-worker ``rate_limit``.

The limit is a token bucket in the cluster's shared store (``celeriac.stores``:
a Redis script, a PostgreSQL row, a SQLite transaction). A worker does not make a round
trip per task: ``SharedTokens`` asks for a small batch (``batch_for(rate)``, about 0.1 s
worth, which is also the bucket's capacity) and only for jobs it holds and could start
now, so tokens are spent as soon as they arrive instead of being hoarded while others
wait. Over any window the cluster starts at most ``rate * window + batch`` tasks of the
name; the few tokens a worker could not spend at once (its pool filled meanwhile) lapse
after ``TOKEN_TTL`` rather than be spent in a later burst.

It plugs into the worker's ``RateLimiter`` (``ratelimit.py``): a limited task's
``Limit`` carries its ``SharedTokens``, a job needs a shared token (and a local one if the
task also has ``rate_limit``) to go to the pool, and jobs without one are held there
as for the local limit (owned, counted against prefetch, not blocking other tasks). The
store calls run on one thread of their own (``StoreRunner``): the loop never waits on
the network. A store that fails keeps the held jobs waiting (never dropped) and is
retried with backoff, with one log line when it fails and one when it answers again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from ..clients.net import backoff
from ..stores import SharedStore, batch_for

if TYPE_CHECKING:
    from .ratelimit import Scheduler

logger = logging.getLogger("celeriac.worker.globalrate")

T = TypeVar("T")
TOKEN_TTL = 1.0
"""Seconds a granted token may wait for its job; later it lapses (spending it late could
add to another window's burst)."""
MIN_WAIT = 0.001


class StoreRunner:
    """The thread the worker's shared-store calls run on, one at a time."""

    def __init__(self, name: str) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self.name = name

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix=self.name)
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None


class SharedTokens:
    """This worker's side of one task name's global limit: the tokens the store granted
    and not yet spent, and at most one request in flight."""

    def __init__(self, name: str, rate: float, store: SharedStore, runner: StoreRunner,
                 timer: Scheduler, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.rate = rate
        self.capacity = batch_for(rate)
        self.store = store
        self.runner = runner
        self.timer = timer
        self.clock = clock
        self.tokens = 0
        self._granted_at = 0.0
        self.pending = False
        """A request is in flight, or waiting out the store's ``wait``."""
        self.failures = 0
        self.asked = 0
        """Round trips made (for tests and the log)."""
        self._task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"<SharedTokens {self.name} {self.rate:g}/s tokens={self.tokens}>"

    def available(self) -> bool:
        if self.tokens and self.clock() - self._granted_at > TOKEN_TTL:
            logger.debug("%s: %d unspent global token(s) lapsed", self.name, self.tokens)
            self.tokens = 0
        return self.tokens > 0

    def take(self) -> None:
        self.tokens -= 1

    def request(self, want: int, done: Callable[[], None]) -> None:
        """Ask the store for up to ``want`` tokens (capped by the batch); ``done()`` is
        called on the loop once some arrived or it is worth asking again. Nothing
        happens if a request is already pending: its ``done`` comes."""
        if self.pending:
            return
        self.pending = True
        want = max(1, min(want, self.capacity))
        # Held here: the loop keeps only a weak reference to its tasks.
        self._task = asyncio.get_running_loop().create_task(self._ask(want, done))

    async def _ask(self, want: int, done: Callable[[], None]) -> None:
        self.asked += 1
        try:
            grant = await self.runner.call(self.store.take, self.name, self.rate,
                                           float(self.capacity), want)
        except Exception as exc:
            self.failures += 1
            if self.failures == 1:
                logger.warning("global rate limit of %s: the %s store failed (%s: %s); "
                               "its tasks wait until it answers", self.name,
                               self.store.kind, type(exc).__name__, exc)
            self._later(backoff(self.failures), done)
            return
        if self.failures:
            logger.warning("global rate limit of %s: the %s store answers again",
                           self.name, self.store.kind)
            self.failures = 0
        if grant.granted:
            self.tokens += grant.granted
            self._granted_at = self.clock()
            self._finish(done)
        else:
            self._later(max(grant.wait, MIN_WAIT), done)

    def _later(self, delay: float, done: Callable[[], None]) -> None:
        self.timer.call_after(delay, self._finish, done)

    def _finish(self, done: Callable[[], None]) -> None:
        self.pending = False
        done()

    def set_rate(self, rate: float) -> None:
        self.rate = rate
        self.capacity = batch_for(rate)
