"""The shared store of the in-process ``memory://`` broker: one process, one lock."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from .base import Grant, SharedStore, bucket_take, check_args

_STORES: dict[str, MemoryStore] = {}
_LOCK = threading.Lock()


def memory_store(url: str) -> MemoryStore:
    """The store of the memory broker at ``url`` (shared, as its transports are)."""
    with _LOCK:
        store = _STORES.get(url)
        if store is None:
            store = _STORES[url] = MemoryStore()
        return store


class MemoryStore(SharedStore):
    kind = "memory"

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self.buckets: dict[str, tuple[float, float]] = {}
        self.leases: dict[str, tuple[str, float]] = {}

    def take(self, name: str, rate: float, capacity: float, want: int) -> Grant:
        check_args(rate, capacity, want)
        with self.lock:
            now = self.clock()
            tokens, stamp = self.buckets.get(name, (capacity, now))
            tokens, stamp, grant = bucket_take(tokens, stamp, now, rate, capacity, want)
            self.buckets[name] = (tokens, stamp)
            return grant

    def acquire(self, name: str, owner: str, ttl: float) -> bool:
        with self.lock:
            now = self.clock()
            held = self.leases.get(name)
            if held is not None and held[0] != owner and held[1] > now:
                return False
            self.leases[name] = (owner, now + ttl)
            return True

    def release(self, name: str, owner: str) -> None:
        with self.lock:
            held = self.leases.get(name)
            if held is not None and held[0] == owner:
                del self.leases[name]

    def holder(self, name: str) -> str | None:
        with self.lock:
            held = self.leases.get(name)
            return held[0] if held is not None and held[1] > self.clock() else None
