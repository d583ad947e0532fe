"""What the cluster's workers share through a store: token buckets and leases.

Two primitives, each one atomic operation in the store, so that no two workers can
both believe they won:

- ``take(name, rate, capacity, want)``: a token bucket shared by every worker. Tokens
  accrue at ``rate`` per second up to ``capacity``; a call takes up to ``want`` whole
  tokens and says how long until the rest could be there. The bucket's state (tokens,
  stamp) lives in the store and is refilled from the store's clock where it has one
  (Redis ``TIME``, PostgreSQL's ``statement_timestamp()``), so workers whose clocks
  differ agree. Over any window of ``T`` seconds the store grants at most
  ``capacity + rate * T`` tokens: ``capacity`` is the most the shared rate can exceed
  the limit by.
- ``acquire(name, owner, ttl)``: a lease (take it if free or expired, renew it if
  ``owner`` holds it); ``release(name, owner)`` gives it up if ``owner`` holds it.

Every method is synchronous and may block on the network: the worker calls them on a
thread of its own (``worker/globalrate.py``, ``worker/gossip.py``), never on its loop.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass

BATCH_SECONDS = 0.1
"""A worker asks for about this many seconds' worth of tokens at a time..."""
MAX_BATCH = 100
"""...but never more than this many."""
EPSILON = 1e-9
"""Tokens: float rounding that may not deny a token due at exactly this moment."""


def batch_for(rate: float) -> int:
    """Tokens per request, and the shared bucket's capacity, for ``rate`` per second:
    one round trip per batch rather than per task, and a burst (the most the shared
    rate may exceed the limit by, over any window) of one batch."""
    return max(1, min(MAX_BATCH, int(rate * BATCH_SECONDS)))


@dataclass(frozen=True, slots=True)
class Grant:
    granted: int
    """Whole tokens taken now (0 to ``want``)."""
    wait: float
    """Seconds until the store could grant what was refused (0 when none was)."""


def bucket_take(tokens: float, stamp: float, now: float, rate: float, capacity: float,
                want: int) -> tuple[float, float, Grant]:
    """The bucket arithmetic every store runs (the Redis script and the PostgreSQL
    statement spell it out again): refill from ``stamp`` to ``now``, take up to ``want``
    whole tokens; returns the new ``(tokens, stamp, grant)``. A clock that went back
    refills nothing and keeps the later stamp."""
    tokens = min(capacity, tokens + max(0.0, now - stamp) * rate)
    granted = max(0, min(want, math.floor(tokens + EPSILON)))
    tokens = max(0.0, tokens - granted)
    wait = 0.0
    if granted < want:
        # The rest of the batch, capped by what the bucket can hold: waiting for less
        # would cost a round trip per token under contention.
        wait = max(0.0, min(want - granted, capacity) - tokens) / rate
    return tokens, max(stamp, now), Grant(granted, wait)


class SharedStore(abc.ABC):
    """A store every worker of the cluster reaches: see the module's docstring."""

    kind: str = "?"
    """For log lines: "Redis", "SQLite", "PostgreSQL", "memory"."""

    @abc.abstractmethod
    def take(self, name: str, rate: float, capacity: float, want: int) -> Grant:
        """Take up to ``want`` tokens from the shared bucket ``name``."""

    @abc.abstractmethod
    def acquire(self, name: str, owner: str, ttl: float) -> bool:
        """Hold the lease ``name`` for ``ttl`` seconds from now: True if ``owner`` holds
        it (it was free, expired, or already ``owner``'s: renewed)."""

    @abc.abstractmethod
    def release(self, name: str, owner: str) -> None:
        """Give the lease up, if ``owner`` holds it (a lease taken over is left alone)."""

    @abc.abstractmethod
    def holder(self, name: str) -> str | None:
        """Who holds the lease now (None: nobody, or it expired)."""

    def close(self) -> None:
        """Close this process's connections."""


def check_args(rate: float, capacity: float, want: int) -> None:
    if not rate > 0 or not capacity >= 1 or want < 1:
        raise ValueError(f"rate > 0, capacity >= 1 and want >= 1 expected, got "
                         f"{rate!r}, {capacity!r}, {want!r}")
