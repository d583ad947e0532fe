"""Flow control in the worker: unique jobs' locks let go, concurrency slots held.

**Unique locks** (``producer/flow.py`` takes them; a message carries its lock in the
``celeriac_unique`` header). The lock is tied to the message: this worker releases it
(compare-and-delete by task id, so a later job's lock is never dropped) as the job
starts (``until_started``, ``debounce``) or ends (``until_finished``; not on ``RETRY``:
the retry's message carries the lock on), when the message goes back to its queue or
arrives redelivered (its worker died: the lock goes with the redelivery), and when it
is dropped (revoked, expired, dead-lettered). A worker that dies holding one cannot keep
it: its message is redelivered within its lease, and the lock lapses after
``unique_for`` anyway.

**Concurrency slots** (``@app.task(concurrency=5)``, per key with ``concurrency_key``:
the producer puts the key in the ``celeriac_concurrency`` header). A job takes a slot
of the semaphore ``conc:<task>[:<key>]`` in the shared store before it goes to the pool;
without one it is *held* here, as the rate limiter holds jobs: still owned by this
worker (its message lease), outside the pool and ``reserved``, not counted against the
prefetch up to ``HOLD_FACTOR`` times it, never dropped (a warm stop gives it back). One
request per semaphore is in flight at a time, on the store's thread (``StoreRunner``);
a refusal is asked again after ``POLL`` seconds, or at once when a slot of the same
semaphore is released here. Each slot is a lease of ``worker_lease_timeout`` that this
worker renews with its message lease (every quarter of it), so a dead worker's slots
come back within its lease.

**Debounce** (``unique_mode="debounce"``): a debounced job runs only if it still holds
its lock as it comes due (the producer swapped each later call in); one superseded is
settled ``REVOKED``. **``worker_deduplicate_successful_tasks``**: a redelivered job of
an ``acks_late`` task whose id succeeded (here, else in the result backend) is
acknowledged unrun. Both read the store before the job goes on, holding it meanwhile as a
slot's waiters are held.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any

from .. import states
from ..producer.flow import CONCURRENCY_HEADER, UNIQUE_HEADER
from ..stores import SharedStore, store_for
from ..stores.memory import MemoryStore
from .globalrate import StoreRunner

if TYPE_CHECKING:
    from ..app import Celeriac
    from ..protocol import Delivery
    from .execute import Job, Outcome
    from .timer import Entry, Timer

logger = logging.getLogger("celeriac.worker.limits")

POLL = 0.2
"""Seconds before a refused semaphore is asked again (sooner on a local release)."""
HOLD_FACTOR = 8
"""Held jobs the prefetch budget does not count, in multiples of it."""
RELEASED_AT_START = ("until_started", "debounce")
SUCCEEDED_KEPT = 10_000
"""Ids of tasks that succeeded here, kept for ``worker_deduplicate_successful_tasks``."""


def wanted(app: Celeriac) -> bool:
    """Whether this app's worker needs flow control (a task with its options, or
    ``worker_deduplicate_successful_tasks``)."""
    return app.settings.worker_deduplicate_successful_tasks or needs_store(app) is not None


def needs_store(app: Celeriac) -> str | None:
    """What needs the shared store here (``task 'x': concurrency``), for the error a
    deployment without one gets at the worker's start; None: nothing does."""
    for name, task in app.tasks.items():
        for option in ("unique_for", "concurrency"):
            if getattr(task.options, option, None):
                return f"task {name!r}: {option}"
    return None


def lock_of(headers: dict[str, Any]) -> tuple[str, str] | None:
    """The message's unique lock and mode; None without one (or a malformed header:
    its lock then lapses after ``unique_for``)."""
    spec = headers.get(UNIQUE_HEADER)
    if type(spec) is list and len(spec) == 2 and isinstance(spec[0], str) and \
            isinstance(spec[1], str):
        return spec[0], spec[1]
    return None


class FlowControl:
    """One consumer's unique locks and concurrency slots; see the module's docstring."""

    def __init__(self, app: Celeriac, timer: Timer, reserved: deque[Job],
                 dispatch: Callable[[], None], drop: Callable[[Job], None],
                 skip: Callable[[Job], None], hostname: str) -> None:
        self.app = app
        self.timer = timer
        self.reserved = reserved
        """The consumer's: a job granted its slot goes to its front."""
        self.dispatch = dispatch
        self.drop = drop
        """Settles a job that must not run as revoked (a debounced call superseded)."""
        self.skip = skip
        """Acknowledges a job that must not run again (it succeeded: deduplicated)."""
        self.dedupe: bool = app.settings.worker_deduplicate_successful_tasks
        self.succeeded: dict[str, None] = {}
        """Ids that succeeded here, oldest first (``SUCCEEDED_KEPT`` at most)."""
        self.fresh: set[int] = set()
        """Redelivered jobs found not to have succeeded before: they run."""
        self.after_store: list[tuple[dict[str, Any], str]] = []
        """Locks of jobs whose result the pump has yet to store (``finished``)."""
        self.ttl: float = app.settings.worker_lease_timeout
        self.owner = f"{hostname}:{os.getpid()}"
        purpose = needs_store(app)
        # Deduplication alone needs the result backend only: no store is asked for then
        # (the memory one stands in, and nothing is kept in it).
        self.store: SharedStore = store_for(app.settings, purpose) if purpose else \
            MemoryStore()
        self.runner = StoreRunner("celeriac-flow")
        self.limits: dict[str, int | None] = {}
        self.held: dict[str, deque[Job]] = {}
        """Semaphore name -> jobs waiting for a slot, oldest first."""
        self.held_count = 0
        self.asking: set[str] = set()
        self._later: dict[str, Entry] = {}
        self.slots: dict[int, tuple[str, str]] = {}
        """Job seq -> (semaphore, holder) of the slots held."""
        self.checking: dict[int, Job] = {}
        """Jobs held while the store is read: a debounced job (does it still hold its
        lock?), a redelivered one (did it succeed already?)."""
        self.passed: set[int] = set()
        """Debounced jobs found holding their lock: they run."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self._failures = 0
        self._renewal = timer.call_repeatedly(max(self.ttl / 4, 0.05), self._renew)

    # -- unique locks ---------------------------------------------------------------------
    def arrived(self, d: Delivery) -> None:
        """A message came: redelivered, its lock goes (its first worker died)."""
        if d.delivery_count > 1:
            self._unlock(d.message.headers, "redelivered")

    def started(self, job: Job) -> None:
        lock = lock_of(job.headers)
        if lock is not None and lock[1] in RELEASED_AT_START:
            self._unlock(job.headers, "started")

    def finished(self, job: Job, outcome: Outcome) -> None:
        self.forget((job,))
        if self.dedupe and outcome.state == states.SUCCESS:
            self.succeeded[job.headers["id"]] = None
            if len(self.succeeded) > SUCCEEDED_KEPT:
                del self.succeeded[next(iter(self.succeeded))]
        lock = lock_of(job.headers)
        if lock is None or (lock[1] in RELEASED_AT_START and outcome.action != "requeue"):
            return
        if outcome.state == states.RETRY:
            return  # its retry's message carries the lock on
        why = "going back" if outcome.action == "requeue" else "ended"
        if outcome.stored is not None and not outcome.settled:
            # Its result first, then its lock: a stand-in (producer/flow.py, ``awaited``)
            # reads a lock gone and no result as "none is coming". The pump stores the
            # result at its next turn, and then lets the lock go (``unlock``).
            self.after_store.append((job.headers, why))
            return
        self._unlock(job.headers, why)

    def take_after_store(self) -> list[tuple[dict[str, Any], str]]:
        """The locks waiting for their results (a turn about to store them)."""
        taken, self.after_store = self.after_store, []
        return taken

    def unlock(self, stored: list[tuple[dict[str, Any], str]]) -> None:
        """Let go the locks of jobs whose results are now stored (``after_store``)."""
        for headers, why in stored:
            self._unlock(headers, why)

    def dropped(self, headers: dict[str, Any]) -> None:
        """Revoked, expired or dead-lettered: it will not run here."""
        self._unlock(headers, "dropped")

    def _unlock(self, headers: dict[str, Any], why: str) -> None:
        lock = lock_of(headers)
        if lock is None:
            return
        logger.debug("Task %s[%s] %s: releasing its unique lock %s", headers.get("task"),
                     headers.get("id"), why, lock[0])
        self._spawn(self._call(self.store.release, lock[0], headers["id"]))

    # -- concurrency slots ----------------------------------------------------------------
    def limit(self, name: str) -> int | None:
        found = self.limits.get(name, -1)
        if found == -1:
            task = self.app.tasks.get(name)
            found = self.limits[name] = getattr(getattr(task, "options", None),
                                                "concurrency", None)
        return found

    def admit(self, job: Job) -> bool:
        """True: ``job`` may go to the pool (it holds a slot, or needs none). False: it
        is held until its semaphore grants one."""
        if job.seq in self.slots:
            return True
        if self.dedupe and job.delivery_count > 1 and job.seq not in self.fresh and \
                self._acks_late(job):
            if job.headers["id"] in self.succeeded:
                self._duplicate(job)
                return False
            self.checking[job.seq] = job
            self._spawn(self._check_succeeded(job))
            return False
        lock = lock_of(job.headers)
        if lock is not None and lock[1] == "debounce" and job.seq not in self.passed:
            self.checking[job.seq] = job
            self._spawn(self._check(job, lock[0]))
            return False
        limit = self.limit(job.headers["task"])
        if limit is None:
            return True
        sem = semaphore(job.headers)
        self.held.setdefault(sem, deque()).append(job)
        self.held_count += 1
        logger.debug("Task %s[%s] waits for a slot of %s (at most %d at once)",
                     job.headers["task"], job.headers["id"], sem, limit)
        self._ask(sem, limit)
        return False

    def _ask(self, sem: str, limit: int) -> None:
        if sem in self.asking or not self.held.get(sem):
            return
        entry = self._later.pop(sem, None)
        if entry is not None:
            entry.cancel()
        self.asking.add(sem)
        self._spawn(self._take(sem, limit))

    async def _take(self, sem: str, limit: int) -> None:
        queue = self.held[sem]
        try:
            while queue:
                job = queue[0]
                holder = f"{self.owner}:{job.seq}:{job.headers['id']}"
                got = await self._call(self.store.slot_take, sem, holder, limit, self.ttl)
                if not queue or queue[0] is not job:  # given back meanwhile (a stop)
                    if got:
                        await self._call(self.store.slot_release, sem, holder)
                    continue
                if not got:
                    self._later[sem] = self.timer.call_after(POLL, self._ask, sem, limit)
                    return
                queue.popleft()
                self.held_count -= 1
                self.slots[job.seq] = (sem, holder)
                self.reserved.appendleft(job)
                self.dispatch()
        finally:
            self.asking.discard(sem)

    async def _check(self, job: Job, lock: str) -> None:
        # The last call of a debounce window holds the lock (producer/flow.py swaps it
        # in): an earlier one finds another id there and is not run. A store that
        # fails answers None here: the job runs (at least once, never lost).
        holder = await self._call(self.store.holder, lock)
        if self.checking.pop(job.seq, None) is None:
            return  # given back meanwhile (a stop)
        if holder is not None and holder != job.headers["id"]:
            logger.info("Task %s[%s] debounced: a later call (%s) runs instead",
                        job.headers["task"], job.headers["id"], holder)
            return self.drop(job)
        self.passed.add(job.seq)
        self.reserved.appendleft(job)
        self.dispatch()

    def _acks_late(self, job: Job) -> bool:
        task = self.app.tasks.get(job.headers["task"])
        return task is not None and bool(task.acks_late)

    def _duplicate(self, job: Job) -> None:
        logger.info("Task %s[%s] redelivered after it succeeded: not run again "
                    "(worker_deduplicate_successful_tasks)", job.headers["task"],
                    job.headers["id"])
        self.skip(job)

    async def _check_succeeded(self, job: Job) -> None:
        metas = await self._call(self.app.backend.get_many, [job.headers["id"]])
        if self.checking.pop(job.seq, None) is None:
            return  # given back meanwhile (a stop)
        meta = (metas or {}).get(job.headers["id"])
        if meta is not None and meta.state == states.SUCCESS:
            return self._duplicate(job)
        self.fresh.add(job.seq)  # unknown (or the backend failed): it runs
        self.reserved.appendleft(job)
        self.dispatch()

    def forget(self, jobs: Iterable[Job]) -> None:
        """Release the slots of ``jobs`` (ended, dropped, given back); wake their
        semaphores' waiters here."""
        for job in jobs:
            self.passed.discard(job.seq)
            self.fresh.discard(job.seq)
            slot = self.slots.pop(job.seq, None)
            if slot is None:
                continue
            sem, holder = slot
            self._spawn(self._call(self.store.slot_release, sem, holder))
            limit = self.limit(job.headers["task"])
            if limit is not None:
                self._ask(sem, limit)  # queued behind the release on the store's thread

    def exempt(self, prefetch_limit: int) -> int:
        """Messages in hand the prefetch budget does not count (held ones)."""
        return min(self.held_count + len(self.checking), HOLD_FACTOR * prefetch_limit)

    def drain(self) -> list[Job]:
        """Take every held job out (to give its message back)."""
        jobs = [job for queue in self.held.values() for job in queue]
        jobs += self.checking.values()
        self.checking.clear()
        for queue in self.held.values():
            queue.clear()
        for entry in self._later.values():
            entry.cancel()
        self._later.clear()
        self.held_count = 0
        return jobs

    async def _renew(self) -> None:
        by_sem: dict[str, list[str]] = {}
        for sem, holder in self.slots.values():
            by_sem.setdefault(sem, []).append(holder)
        for sem, holders in by_sem.items():
            kept = await self._call(self.store.slot_renew, sem, holders, self.ttl)
            if kept is not None and kept < len(holders):
                logger.warning("%d slot(s) of %s lapsed before this worker renewed them "
                               "(the store was out of reach longer than "
                               "worker_lease_timeout): the limit may be passed meanwhile",
                               len(holders) - kept, sem)

    # -- the store's thread ---------------------------------------------------------------
    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the store's thread; None (logged, once per outage) if the
        store fails: a lock then lapses on its own, a slot is asked for again."""
        try:
            got = await self.runner.call(fn, *args)
        except Exception as exc:
            self._failures += 1
            if self._failures == 1:
                logger.warning("flow control: the %s store failed (%s: %s); unique locks "
                               "lapse on their own, jobs waiting for a slot wait on",
                               self.store.kind, type(exc).__name__, exc)
            return None
        if self._failures:
            logger.warning("flow control: the %s store answers again", self.store.kind)
            self._failures = 0
        return got

    def _spawn(self, op: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(op)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Let the store calls in flight end (slot releases of a warm stop), then stop
        the renewal and close the store."""
        self._renewal.cancel()
        self.drain()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5.0)
        self.runner.close()
        self.store.close()


def semaphore(headers: dict[str, Any]) -> str:
    """``conc:<task>``, or ``conc:<task>:<key>`` with a concurrency key."""
    key = headers.get(CONCURRENCY_HEADER)
    name = headers["task"]
    return f"conc:{name}:{key}" if isinstance(key, str) else f"conc:{name}"


__all__ = ["FlowControl", "lock_of", "semaphore", "wanted"]
