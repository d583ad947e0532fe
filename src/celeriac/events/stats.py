"""Task statistics for ``ClusterState.stats()``: totals, throughput, runtimes.

They count every transition, so they outlive the LRU that bounds the tasks in memory;
their own memory is bounded by the number of task names and states (throughput keeps
one counter per second of the window, runtimes the last ``RUNTIME_SAMPLES`` per name).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from .. import states

COMPLETED = frozenset({states.SUCCESS, states.FAILURE})
"""What throughput counts: executions that ended (not revocations or rejections)."""
THROUGHPUT_WINDOW = 60
RUNTIME_SAMPLES = 1000


class TaskStats:
    def __init__(self) -> None:
        self.totals: dict[str, int] = {}
        self.by_task: dict[str, dict[str, int]] = {}
        self.runtimes: dict[str, Runtime] = {}
        self.completed: deque[list[int]] = deque()  # [second, count] over the window
        self.started_at: float | None = None

    def transition(self, name: str | None, state: str, now: float) -> None:
        """A task entered ``state``."""
        self.totals[state] = self.totals.get(state, 0) + 1
        if name is not None:
            per = self.by_task.setdefault(name, {})
            per[state] = per.get(state, 0) + 1
        if state in COMPLETED:
            second = int(now)
            if self.completed and self.completed[-1][0] == second:
                self.completed[-1][1] += 1
            else:
                self.completed.append([second, 1])

    def runtime(self, name: str, seconds: float) -> None:
        self.runtimes.setdefault(name, Runtime()).add(seconds)

    def throughput(self, now: float) -> tuple[float, float]:
        """(completed tasks per second, over how many seconds): the last 60 s, or since
        the first event when that is more recent (but at least 1 s)."""
        cutoff = int(now) - THROUGHPUT_WINDOW
        while self.completed and self.completed[0][0] <= cutoff:
            self.completed.popleft()
        since = now - (self.started_at if self.started_at is not None else now)
        window = min(float(THROUGHPUT_WINDOW), max(since, 1.0))
        return sum(c for _, c in self.completed) / window, window

    def as_dict(self, now: float) -> dict[str, Any]:
        per_s, window = self.throughput(now)
        return {
            "totals": dict(self.totals),
            "by_task": {name: dict(c) for name, c in self.by_task.items()},
            "throughput": per_s,
            "throughput_window": window,
            "runtime": {name: r.as_dict() for name, r in self.runtimes.items()},
        }


class Runtime:
    """Count, sum and max of every runtime; percentiles over the latest samples."""

    __slots__ = ("count", "max", "samples", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.max = 0.0
        self.samples: deque[float] = deque(maxlen=RUNTIME_SAMPLES)

    def add(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        self.max = max(self.max, seconds)
        self.samples.append(seconds)

    def as_dict(self) -> dict[str, float]:
        ordered = sorted(self.samples)
        return {"count": self.count, "sum": self.total, "max": self.max,
                "p50": percentile(ordered, 0.50), "p95": percentile(ordered, 0.95)}


def percentile(ordered: list[float], q: float) -> float:
    """Nearest rank: the smallest sample with at least ``q`` of all samples at or
    below it (0.0 without samples)."""
    if not ordered:
        return 0.0
    rank = max(1, math.ceil(round(len(ordered) * q, 9)))  # round: 20 * 0.95 is not 19.0
    return ordered[min(rank, len(ordered)) - 1]
