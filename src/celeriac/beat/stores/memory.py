"""The memory store: one process's beats share it by URL (``memory://name``), for tests
and eager mode. One lock makes every operation atomic; ``clock`` (unix seconds) can be
replaced by a test's fake clock, which lease expiry then follows."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..store import LEDGER_LENGTH, BeatStore, Lease, Run, run_key

if TYPE_CHECKING:
    from ...settings import Settings


@dataclass
class _State:
    lock: threading.Lock = field(default_factory=threading.Lock)
    lease: Lease | None = None
    entries: dict[str, bytes] = field(default_factory=dict)
    last: dict[str, int] = field(default_factory=dict)
    keys: set[str] = field(default_factory=set)
    ledger: deque[Run] = field(default_factory=lambda: deque(maxlen=LEDGER_LENGTH))


_STATES: dict[str, _State] = {}
_GUARD = threading.Lock()


class MemoryStore(BeatStore):
    def __init__(self, url: str, settings: Settings,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(url, settings)
        name = urlsplit(url).netloc + urlsplit(url).path
        with _GUARD:
            self._s = _STATES.setdefault(name, _State())
        self.clock = clock

    def _holds(self, holder: str) -> bool:
        lease = self._s.lease
        return lease is not None and lease.holder == holder and lease.expires > self.clock()

    def acquire(self, holder: str, ttl: float) -> bool:
        with self._s.lock:
            lease = self._s.lease
            now = self.clock()
            if lease is None or lease.holder == holder or lease.expires <= now:
                self._s.lease = Lease(holder, now + ttl)
                return True
            return False

    def release(self, holder: str) -> None:
        with self._s.lock:
            if self._s.lease is not None and self._s.lease.holder == holder:
                self._s.lease = None

    def leader(self) -> Lease | None:
        with self._s.lock:
            lease = self._s.lease
            return lease if lease is not None and lease.expires > self.clock() else None

    def claim(self, holder: str, name: str, due_ms: int) -> bool:
        with self._s.lock:
            key = run_key(name, due_ms)
            if (not self._holds(holder) or self._s.last.get(name, -1) >= due_ms
                    or key in self._s.keys):
                return False
            self._s.keys.add(key)
            self._s.last[name] = due_ms
            self._s.ledger.appendleft(Run(name, due_ms, holder))
            return True

    def advance(self, holder: str, name: str, due_ms: int) -> bool:
        with self._s.lock:
            if not self._holds(holder) or self._s.last.get(name, -1) >= due_ms:
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
