"""``SharedStore``: what the processes of a deployment share through one store.

Four things, each operation atomic in the store, so that no two callers can both
believe they won:

- **leases** (``acquire``/``release``/``lease``): a named claim with one holder until it
  lapses. ``acquire(name, owner, ttl)`` takes it if it is free or lapsed and renews it
  if ``owner`` holds it; ``release`` gives it up only if ``owner`` still holds it (a lease
  taken over meanwhile is not someone else's to drop). Gossip's elections are leases
  (``worker/gossip.py``) and so is the beat lease (``BEAT_LEASE``, ``beat/service.py``).
- **token buckets** (``take``): a global rate limit shared by every worker. Tokens
  accrue at ``rate`` per second up to ``capacity``; a call takes up to ``want`` whole
  tokens and says how long until the rest could be there. The bucket is refilled from
  the store's clock where it has one (Redis ``TIME``, PostgreSQL's
  ``statement_timestamp()``), so workers whose clocks differ agree. Over any window of
  ``T`` seconds the store grants at most ``capacity + rate * T`` tokens.
- **beat's state**: the entries (JSON, ``BeatEntry.to_json``), each entry's last due
  time (ms since the epoch) and the **run keys** (``<entry>@<due ms>``): ``claim``
  records one only if, in one atomic step, the caller holds the beat lease, the due
  time is later than the entry's last one, and the key is new; it then moves the last
  due time to it. A beat sends a run only after its claim succeeded, so a leader that
  was paused past its lease (and replaced) is refused for every run, and no due time is
  claimed twice. Run keys are kept ``RUN_KEY_TTL`` as a ledger; the monotonic last due
  time is what refuses a repeat after that.
- **revoked ids** (``revoke``/``revoked``/``load_if_changed``): ``app.control.revoke``
  records ids with their expiry before it broadcasts; workers re-read them whenever the
  version (``revoked_version``: whatever the store reads cheaply that changes with every
  write) moved, so a worker that starts later or missed the broadcast still honours it.

Every method is synchronous and may block on the network: workers call them on a
thread (``worker/globalrate.py``, ``worker/gossip.py``, ``worker/revoked.py``,
``beat/runner.py``), never on their loop. Which store a deployment uses:
``celeriac.stores`` (the package's docstring).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from ..clients.net import mask_password
from ..settings import Settings
from .flow import FlowStore

BEAT_LEASE = "celeriac.beat"
"""The name of the lease the leading beat holds (``claim`` checks it)."""
RUN_KEY_TTL = 7 * 86400
"""Seconds a run key is kept (the ledger of sends)."""
LEDGER_LENGTH = 10_000
"""Run keys ``runs()`` can list, newest first."""
BATCH_SECONDS = 0.1
"""A worker asks for about this many seconds' worth of tokens at a time..."""
MAX_BATCH = 100
"""...but never more than this many."""
EPSILON = 1e-9
"""Tokens: float rounding that may not deny a token due at exactly this moment."""

Loaded = tuple[object, dict[str, float] | None]


@dataclass(frozen=True, slots=True)
class Lease:
    holder: str
    expires: float
    """Unix time (the store's clock, where it has one)."""


@dataclass(frozen=True, slots=True)
class Run:
    """A claimed run: entry ``name`` at due time ``due_ms``, claimed by ``holder``."""

    name: str
    due_ms: int
    holder: str

    @property
    def key(self) -> str:
        return run_key(self.name, self.due_ms)


@dataclass(frozen=True, slots=True)
class Grant:
    granted: int
    """Whole tokens taken now (0 to ``want``)."""
    wait: float
    """Seconds until the store could grant what was refused (0 when none was)."""


def run_key(name: str, due_ms: int) -> str:
    return f"{name}@{due_ms}"


def parse_run_key(key: str) -> tuple[str, int]:
    name, _, due = key.rpartition("@")
    return name, int(due)


def batch_for(rate: float) -> int:
    """Tokens per request, and the shared bucket's capacity, for ``rate`` per second:
    one round trip per batch rather than per task, and a burst (the most the shared
    rate may exceed the limit by, over any window) of one batch."""
    return max(1, min(MAX_BATCH, int(rate * BATCH_SECONDS)))


def bucket_take(tokens: float, stamp: float, now: float, rate: float, capacity: float,
                want: int) -> tuple[float, float, Grant]:
    """The bucket arithmetic every store runs (the Redis script and the PostgreSQL
    statement spell it out again): refill from ``stamp`` to ``now``, take up to ``want``
    whole tokens; returns the new ``(tokens, stamp, grant)``. A clock that went back
    refills nothing and keeps the later stamp."""
    tokens = min(capacity, tokens + max(0.0, now - stamp) * rate)
    granted = max(0, min(want, math.floor(tokens + EPSILON)))
    tokens = max(0.0, tokens - granted)
    return tokens, max(stamp, now), Grant(granted, wait_for(granted, want, tokens, rate,
                                                           capacity))


def wait_for(granted: int, want: int, tokens: float, rate: float, capacity: float) -> float:
    """Seconds until the refused part of a take could be granted: the rest of the
    batch, capped by what the bucket can hold (waiting for less would cost a round trip
    per token under contention)."""
    if granted >= want:
        return 0.0
    return max(0.0, min(want - granted, capacity) - tokens) / rate


def check_args(rate: float, capacity: float, want: int) -> None:
    if not rate > 0 or not capacity >= 1 or want < 1:
        raise ValueError(f"rate > 0, capacity >= 1 and want >= 1 expected, got "
                         f"{rate!r}, {capacity!r}, {want!r}")


class SharedStore(FlowStore, abc.ABC):
    """A store every process of the deployment reaches: see the module's docstring (and
    ``flow.py`` for flow control's unique locks and concurrency slots)."""

    kind: ClassVar[str] = "?"
    """For log lines: "Redis", "SQLite", "PostgreSQL", "memory"."""
    process_local: ClassVar[bool] = False
    """True when only this process reaches it (memory): chosen after any other."""

    def __init__(self, url: str, settings: Settings | None = None) -> None:
        self.url = url
        self.safe_url = mask_password(url)
        self.settings = settings or Settings()

    # -- leases -------------------------------------------------------------------------
    @abc.abstractmethod
    def acquire(self, name: str, owner: str, ttl: float) -> bool:
        """Hold the lease ``name`` for ``ttl`` seconds from now: True if ``owner`` holds
        it (it was free, lapsed, or already ``owner``'s: renewed)."""

    @abc.abstractmethod
    def release(self, name: str, owner: str) -> None:
        """Give the lease up, if ``owner`` holds it."""

    @abc.abstractmethod
    def lease(self, name: str) -> Lease | None:
        """Who holds the lease ``name`` now and until when (None: nobody, or lapsed)."""

    def holder(self, name: str) -> str | None:
        lease = self.lease(name)
        return lease.holder if lease is not None else None

    def leader(self) -> Lease | None:
        """The beat lease (``BEAT_LEASE``): the leading beat, if any."""
        return self.lease(BEAT_LEASE)

    # -- token buckets ------------------------------------------------------------------
    @abc.abstractmethod
    def take(self, name: str, rate: float, capacity: float, want: int) -> Grant:
        """Take up to ``want`` tokens from the shared bucket ``name``."""

    # -- beat: run keys and entries -----------------------------------------------------
    @abc.abstractmethod
    def claim(self, holder: str, name: str, due_ms: int) -> bool:
        """Record run ``name@due_ms`` if ``holder`` holds the beat lease, ``due_ms`` is
        later than the entry's last due time and the run key is new; then make
        ``due_ms`` the last due time. True: the caller (alone) may send it."""

    @abc.abstractmethod
    def advance(self, holder: str, name: str, due_ms: int) -> bool:
        """Move the entry's last due time to ``due_ms`` without a run (windows skipped, a
        new entry's starting point), under the same conditions as ``claim``."""

    @abc.abstractmethod
    def last_runs(self) -> dict[str, int]:
        """Each entry's last due time (ms)."""

    @abc.abstractmethod
    def runs(self, limit: int = LEDGER_LENGTH) -> list[Run]:
        """The latest claimed runs, newest first."""

    @abc.abstractmethod
    def entries(self) -> dict[str, bytes]:
        """Every entry's JSON by name."""

    @abc.abstractmethod
    def put_entry(self, name: str, data: bytes) -> None:
        """Add or replace an entry (its last due time is kept)."""

    @abc.abstractmethod
    def remove_entry(self, name: str) -> bool:
        """Delete an entry and its last due time; False if there was none."""

    # -- revoked ids --------------------------------------------------------------------
    @abc.abstractmethod
    def revoke(self, ids: Sequence[str], expires_at: float) -> None:
        """Record ``ids`` as revoked until ``expires_at`` (time.time())."""

    @abc.abstractmethod
    def revoked_version(self) -> object:
        """Changes whenever ``revoke`` ran."""

    @abc.abstractmethod
    def revoked(self) -> dict[str, float]:
        """Every revoked id not yet expired, with its expiry."""

    def load_if_changed(self, version: object) -> Loaded:
        """(version, revoked ids), the ids None when the version is ``version`` still.
        The version is read first: a revoke between the two reads is seen again next
        time, not lost."""
        current = self.revoked_version()
        if current == version:
            return current, None
        return current, self.revoked()

    def close(self) -> None:
        """Close this process's connections."""
