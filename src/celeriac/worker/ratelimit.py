"""Rate limits, per worker and per task name, as Celery's.

A task's limit is its ``rate_limit`` option, else ``task_default_rate_limit``; none at
all with ``worker_disable_rate_limits``. Each limited task name has a ``TokenBucket``;
a job takes one token when the consumer hands it to the pool. A job that finds no token
(or finds jobs of its task already waiting) is *held* here, still owned by this worker,
outside the pool and outside ``Consumer.reserved``: it takes no pool slot and the jobs
behind it go on. The Timer marks its task *due* when the next token accrues; the
consumer's next dispatch releases due jobs first, one per token, in arrival order.

The bucket's capacity is 1, as kombu's ``TokenBucket`` in Celery's worker: after an
idle spell one job starts at once and the next one a full interval later, never a
burst of a whole second's worth.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import ConfigurationError
from ..protocol import parse_time, utcnow
from ..settings.rates import ACCEPTED as ACCEPTED
from ..settings.rates import UNITS as UNITS
from ..settings.rates import parse_rate as parse_rate
from ..stores import store_for
from .globalrate import SharedTokens, StoreRunner

if TYPE_CHECKING:
    from ..app import Celeriac
    from ..stores import SharedStore
    from .execute import Job

logger = logging.getLogger("celeriac.worker.ratelimit")

HOLD_FACTOR = 8
"""Held jobs do not count against the prefetch budget up to this many times it: the
worker keeps fetching past a backlog of limited messages to reach other tasks', yet
cannot pull a whole queue of them into its memory (route big backlogs of a limited task
to a queue of their own)."""
MIN_WAIT = 0.001
"""Seconds: the shortest timer wait, so that a token due "now" but not quite there (the
loop's clock rounds) cannot spin the loop."""
EPSILON = 1e-9
"""Tokens: float rounding that may not deny a token due at exactly this moment."""


class TokenBucket:
    """Tokens accrue at ``rate`` per second up to ``capacity``; starts full.

    ``clock`` is injectable for tests; the worker uses ``time.monotonic``.
    """

    __slots__ = ("_clock", "_stamp", "_tokens", "capacity", "rate")

    def __init__(self, rate: float, capacity: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not rate > 0 or not capacity > 0:
            raise ValueError(f"rate and capacity must be > 0, got {rate!r}, {capacity!r}")
        self.rate = rate
        self.capacity = capacity
        self._clock = clock
        self._tokens = capacity
        self._stamp = clock()

    def _refill(self) -> float:
        now = self._clock()
        if self._tokens < self.capacity:
            self._tokens = min(self.capacity, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        return self._tokens

    def can_consume(self, tokens: float = 1.0) -> bool:
        """Take ``tokens`` if there are that many now."""
        if self._refill() + EPSILON >= tokens:
            self._tokens = max(self._tokens - tokens, 0.0)
            return True
        return False

    def expected_time(self, tokens: float = 1.0) -> float:
        """Seconds until ``tokens`` are there (0 if they are now); takes none."""
        return max(0.0, (tokens - self._refill()) / self.rate)

    def set_rate(self, rate: float) -> None:
        if not rate > 0:
            raise ValueError(f"rate must be > 0, got {rate!r}")
        self._refill()  # what accrued so far, at the old rate
        self.rate = rate


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Scheduler(Protocol):
    """What the limiter needs of the worker's ``Timer``."""

    def call_after(self, delay: float, fn: Callable[..., Any], *args: Any) -> Cancellable: ...


class Limit:
    """One task name's bucket and the jobs it holds, oldest first."""

    __slots__ = ("bucket", "entry", "held", "name", "shared")

    def __init__(self, name: str, bucket: TokenBucket | None) -> None:
        self.name = name
        self.bucket = bucket
        """None once the limit was lifted while jobs were held: they leave untimed (or
        when the task has only a ``global_rate_limit``)."""
        self.shared: SharedTokens | None = None
        """The task's ``global_rate_limit`` (globalrate.py): a job needs one of its
        tokens too."""
        self.held: deque[Job] = deque()
        self.entry: Cancellable | None = None
        """The Timer call that makes this limit due, while one is pending."""

    def __repr__(self) -> str:
        rate = self.bucket.rate if self.bucket is not None else None
        return f"<Limit {self.name} {rate}/s held={len(self.held)}>"


class _Cache(dict[str, Limit | None]):
    """Task name -> its Limit, or None for no limit; computed on first lookup, so the
    consumer's hot path makes one dict lookup per job whatever the task."""

    def __init__(self, compute: Callable[[str], Limit | None]) -> None:
        super().__init__()
        self.compute = compute

    def __missing__(self, name: str) -> Limit | None:
        limit = self[name] = self.compute(name)
        return limit


class RateLimiter:
    """The rate limits of one worker's consumer.

    Invariant: a limit that holds jobs has either a pending timer entry or is in
    ``due`` (never both), so every held job is released eventually.
    """

    def __init__(self, app: Celeriac, timer: Scheduler, wake: Callable[[], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        settings = app.settings
        self.tasks: Mapping[str, Any] = app.tasks
        self.timer = timer
        self.wake = wake
        """Called when held jobs are due: the consumer dispatches."""
        self.clock = clock
        self.disabled: bool = settings.worker_disable_rate_limits
        self.default: float | None = None
        """``task_default_rate_limit`` in tokens per second."""
        self.limits = _Cache(self._compute)
        self._made: dict[str, Limit] = {}
        """Every Limit made, by name, including lifted ones still letting jobs out."""
        self.due: dict[Limit, None] = {}
        """Limits whose next token has accrued (an ordered set); the consumer checks
        it on each dispatch and calls ``release`` when it is not empty."""
        self.held = 0
        """Jobs held, over all task names."""
        self.passes: set[int] = set()
        """Seqs of jobs that hold their token already (released, or handed back by the
        pool unstarted): ``admit`` lets them through."""
        self.settings = settings
        self.room: Callable[[], int] = lambda: 1 << 30
        """How many jobs the pool could take now (the consumer sets it): global tokens
        are asked for only as many jobs as could start."""
        self._shared: dict[str, SharedTokens | None] = {}
        self._store: SharedStore | None = None
        self._runner: StoreRunner | None = None
        if self.disabled:
            return
        # Every registered task's limit now, so that a bad value stops the worker at
        # its start with the task's name instead of failing at its first message
        # (ConfigurationError: the command line prints it as one line).
        try:
            self.default = parse_rate(settings.task_default_rate_limit)
        except ValueError as exc:
            raise ConfigurationError(f"task_default_rate_limit: {exc}") from None
        for name, task in list(app.tasks.items()):
            try:
                self.limits[name] = self._make(name, task.options.rate_limit)
            except ValueError as exc:
                raise ConfigurationError(f"task {name!r}: {exc}") from None

    def _make(self, name: str, option: str | float | None) -> Limit | None:
        rate = parse_rate(option) if option is not None else self.default
        shared = self._shared_for(name)
        if rate is None and shared is None:
            return None
        limit = self._made.get(name)
        if limit is None:
            limit = self._made[name] = Limit(name, None)
        limit.bucket = TokenBucket(rate, clock=self.clock) if rate is not None else None
        limit.shared = shared
        return limit

    def _shared_for(self, name: str) -> SharedTokens | None:
        """The task's global limit (made once: its tokens outlive a ``set_rate``)."""
        if name in self._shared:
            return self._shared[name]
        task = self.tasks.get(name)
        option = getattr(getattr(task, "options", None), "global_rate_limit", None)
        try:
            rate = parse_rate(option)
        except ValueError as exc:
            raise ValueError(f"global_rate_limit: {exc}") from None
        shared = None
        if rate is not None:
            if self._store is None:
                self._store = store_for(self.settings, f"task {name!r}: global_rate_limit")
                self._runner = StoreRunner("celeriac-globalrate")
            assert self._runner is not None
            shared = SharedTokens(name, rate, self._store, self._runner, self.timer)
            logger.info("%s: global rate limit %g/s through the %s store (batches of %d)",
                        name, rate, self._store.kind, shared.capacity)
        self._shared[name] = shared
        return shared

    def _compute(self, name: str) -> Limit | None:
        # A name seen after the start: an unknown one (refused before it gets here) or
        # a task registered late. A bad value there is logged, not fatal.
        task = self.tasks.get(name)
        if self.disabled or task is None:
            return None
        try:
            return self._make(name, task.options.rate_limit)
        except ValueError as exc:
            logger.error("task %r: %s; running it without a rate limit", name, exc)
            return None

    # -- the consumer's calls -----------------------------------------------------------
    def admit(self, limit: Limit, job: Job) -> bool:
        """True: ``job`` may go to the pool now (it took a token). False: it is held."""
        if self.passes and job.seq in self.passes:
            self.passes.discard(job.seq)
            return True
        bucket, shared = limit.bucket, limit.shared
        # Behind jobs of its task already held, a job waits even if a token is there:
        # the order within a task name is kept. The shared token is looked at first and
        # taken last: a job that finds no local token must not spend a global one.
        if not limit.held and (shared is None or shared.available()) and \
                (bucket is None or bucket.can_consume()):
            if shared is not None:
                shared.take()
            return True
        limit.held.append(job)
        self.held += 1
        if len(limit.held) == 1:
            self._schedule(limit)
        logger.debug("Task %s[%s] held by its rate limit (%d held)", limit.name,
                     job.headers["id"], len(limit.held))
        return False

    def release(self, reserved: deque[Job], room: int) -> list[Job]:
        """Move up to ``room`` due jobs, each with its token, to the front of
        ``reserved`` (in their order) for the dispatch that follows. A limit whose
        jobs found no room stays due: the next dispatch (a slot freed) tries again.

        Returns the held jobs found expired on the way (they took no token): a job can
        wait here long, and Celery does not run an expired task; the consumer revokes
        them."""
        out: list[Job] = []
        expired: list[Job] = []
        now = utcnow()
        for limit in list(self.due):
            bucket = limit.bucket
            while room > 0 and limit.held:
                job = limit.held[0]
                when = job.headers.get("expires")
                if when is not None and (at := parse_time(when)) is not None and at <= now:
                    expired.append(limit.held.popleft())
                    self.held -= 1
                    continue
                shared = limit.shared
                if shared is not None and not shared.available():
                    break
                if bucket is not None and not bucket.can_consume():
                    break
                if shared is not None:
                    shared.take()
                limit.held.popleft()
                self.held -= 1
                self.passes.add(job.seq)
                out.append(job)
                room -= 1
            if not limit.held:
                del self.due[limit]
            elif room > 0:  # stopped for want of a token: wait for the next one
                del self.due[limit]
                self._schedule(limit)
        reserved.extendleft(reversed(out))
        return expired

    def returned(self, job: Job) -> None:
        """The pool handed ``job`` back unstarted: it keeps the token it took."""
        if self.limits[job.headers["task"]] is not None:
            self.passes.add(job.seq)

    def budget_exempt(self, prefetch_limit: int) -> int:
        """How many messages in hand the prefetch budget does not count (held ones)."""
        return min(self.held, HOLD_FACTOR * prefetch_limit)

    def drain(self) -> list[Job]:
        """Take every held job out (to give its message back); no timer stays armed."""
        jobs: list[Job] = []
        for limit in self._made.values():
            if limit.entry is not None:
                limit.entry.cancel()
                limit.entry = None
            jobs.extend(limit.held)
            limit.held.clear()
        self.due.clear()
        self.passes.clear()
        self.held = 0
        return jobs

    # -- the timer ----------------------------------------------------------------------
    def _schedule(self, limit: Limit) -> None:
        shared = limit.shared
        if shared is not None and not shared.available():
            # Global tokens first; when they come, the local wait (if any) follows.
            want = min(len(limit.held), self.room())
            shared.request(want, lambda: self._shared_done(limit))
            return
        wait = limit.bucket.expected_time() if limit.bucket is not None else 0.0
        limit.entry = self.timer.call_after(max(wait, MIN_WAIT), self._due, limit)

    def _shared_done(self, limit: Limit) -> None:
        # Tokens came (or it is time to ask again): go on unless something else already
        # took charge of this limit (a release, a rearm) or nothing is held any more.
        if limit.held and limit.entry is None and limit not in self.due:
            self._schedule(limit)

    def close(self) -> None:
        """Stop the shared store's thread and close its connections."""
        if self._runner is not None:
            self._runner.close()
        if self._store is not None:
            self._store.close()

    def _due(self, limit: Limit) -> None:
        limit.entry = None
        if limit.held:
            self.due[limit] = None
            self.wake()

    # -- at runtime (for the remote-control command) -------------------------------------
    def set_rate(self, task_name: str, rate: str | float | int | None) -> float | None:
        """Change ``task_name``'s limit in this worker from now on; returns the new
        tokens per second (None: no limit). None or 0 lifts the limit (it does not go
        back to ``task_default_rate_limit``), as Celery's ``rate_limit`` command.
        With ``worker_disable_rate_limits`` nothing changes and it returns None.
        Raises ``KeyError`` for a task this worker does not know, ``ValueError`` for
        a bad rate; jobs already held keep their order. Call it on the worker's loop
        (the consumer's thread): nothing here takes a lock."""
        if task_name not in self.tasks:
            raise KeyError(f"unknown task {task_name!r}")
        per_second = parse_rate(rate)
        if self.disabled:
            return None
        limit = self._made.get(task_name)
        if per_second is None:
            # A global limit stays: it is the cluster's, not this worker's to lift.
            self.limits[task_name] = limit if limit is not None and limit.shared else None
            if limit is not None:
                # Held jobs leave without tokens, still ahead of newer ones.
                limit.bucket = None
                self._rearm(limit)
        else:
            if limit is None:
                limit = self._made[task_name] = Limit(task_name, None)
            if limit.bucket is None:
                limit.bucket = TokenBucket(per_second, clock=self.clock)
            else:
                limit.bucket.set_rate(per_second)
            self.limits[task_name] = limit
            self._rearm(limit)
        logger.info("rate limit of %s set to %s", task_name,
                    f"{per_second:g}/s" if per_second else "none")
        return per_second

    def _rearm(self, limit: Limit) -> None:
        # A pending wait was computed at the old rate: compute it again.
        if limit.entry is not None:
            limit.entry.cancel()
            limit.entry = None
            self._schedule(limit)
