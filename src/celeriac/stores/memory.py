"""The memory store (``memory://name``): one process's callers share it by URL, for
tests and eager mode. One lock makes every operation atomic; ``clock`` (unix seconds)
can be a test's fake clock, which leases and buckets then follow."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from .base import (
    BEAT_LEASE,
    LEDGER_LENGTH,
    Grant,
    Lease,
    Run,
    SharedStore,
    bucket_take,
    check_args,
    run_key,
)
from .memory_flow import MemoryFlow

if TYPE_CHECKING:
    from ..settings import Settings


@dataclass
class _State:
    lock: threading.Lock = field(default_factory=threading.Lock)
    leases: dict[str, Lease] = field(default_factory=dict)
    buckets: dict[str, tuple[float, float]] = field(default_factory=dict)
    entries: dict[str, bytes] = field(default_factory=dict)
    last: dict[str, int] = field(default_factory=dict)
    keys: set[str] = field(default_factory=set)
    ledger: deque[Run] = field(default_factory=lambda: deque(maxlen=LEDGER_LENGTH))
    revoked: dict[str, float] = field(default_factory=dict)
    revokes: int = 0


_STATES: dict[str, _State] = {}
_GUARD = threading.Lock()


class MemoryStore(MemoryFlow, SharedStore):
    kind = "memory"
    process_local = True

    def __init__(self, url: str | None = None, settings: Settings | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        """Without ``url``: a store of its own (tests)."""
        super().__init__(url or "memory://", settings)
        self.clock = clock
        if url is None:
            self._s = _State()
            return
        parts = urlsplit(url.split(";")[0].strip())
        with _GUARD:
            self._s = _STATES.setdefault((parts.netloc + parts.path).rstrip("/"), _State())

    # -- leases -------------------------------------------------------------------------
    def _holds(self, name: str, owner: str) -> bool:
        lease = self._s.leases.get(name)
        return lease is not None and lease.holder == owner and lease.expires > self.clock()

    def acquire(self, name: str, owner: str, ttl: float) -> bool:
        with self._s.lock:
            now = self.clock()
            lease = self._s.leases.get(name)
            if lease is None or lease.holder == owner or lease.expires <= now:
                self._s.leases[name] = Lease(owner, now + ttl)
                return True
            return False

    def release(self, name: str, owner: str) -> None:
        with self._s.lock:
            lease = self._s.leases.get(name)
            if lease is not None and lease.holder == owner:
                del self._s.leases[name]

    def lease(self, name: str) -> Lease | None:
        with self._s.lock:
            lease = self._s.leases.get(name)
            return lease if lease is not None and lease.expires > self.clock() else None

    # -- token buckets ------------------------------------------------------------------
    def take(self, name: str, rate: float, capacity: float, want: int) -> Grant:
        check_args(rate, capacity, want)
        with self._s.lock:
            now = self.clock()
            tokens, stamp = self._s.buckets.get(name, (capacity, now))
            tokens, stamp, grant = bucket_take(tokens, stamp, now, rate, capacity, want)
            self._s.buckets[name] = (tokens, stamp)
            return grant

    # -- beat ---------------------------------------------------------------------------
    def claim(self, holder: str, name: str, due_ms: int) -> bool:
        with self._s.lock:
            key = run_key(name, due_ms)
            if (not self._holds(BEAT_LEASE, holder) or self._s.last.get(name, -1) >= due_ms
                    or key in self._s.keys):
                return False
            self._s.keys.add(key)
            self._s.last[name] = due_ms
            self._s.ledger.appendleft(Run(name, due_ms, holder))
            return True

    def advance(self, holder: str, name: str, due_ms: int) -> bool:
        with self._s.lock:
            if not self._holds(BEAT_LEASE, holder) or self._s.last.get(name, -1) >= due_ms:
                return False
            self._s.last[name] = due_ms
            return True

    def last_runs(self) -> dict[str, int]:
        with self._s.lock:
            return dict(self._s.last)

    def runs(self, limit: int = LEDGER_LENGTH) -> list[Run]:
        with self._s.lock:
            return list(self._s.ledger)[:limit]

    def entries(self) -> dict[str, bytes]:
        with self._s.lock:
            return dict(self._s.entries)

    def put_entry(self, name: str, data: bytes) -> None:
        with self._s.lock:
            self._s.entries[name] = data

    def remove_entry(self, name: str) -> bool:
        with self._s.lock:
            self._s.last.pop(name, None)
            return self._s.entries.pop(name, None) is not None

    # -- revoked ids --------------------------------------------------------------------
    def revoke(self, ids: Sequence[str], expires_at: float) -> None:
        with self._s.lock:
            for i in ids:
                self._s.revoked[i] = max(expires_at, self._s.revoked.get(i, 0.0))
            self._s.revokes += 1

    def revoked_version(self) -> object:
        with self._s.lock:
            return self._s.revokes

    def revoked(self) -> dict[str, float]:
        now = time.time()
        with self._s.lock:
            return {k: v for k, v in self._s.revoked.items() if v > now}
