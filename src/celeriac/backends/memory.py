"""In-process result store for unit tests and eager mode."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .base import ResultBackend

if TYPE_CHECKING:
    from ..settings import Settings

_Store = dict[str, tuple[str, bytes, float | None]]
_STORES: dict[str, tuple[_Store, threading.Condition]] = {}
_LOCK = threading.Lock()


class MemoryBackend(ResultBackend):
    scheme = "memory"
    process_local = True

    def __init__(self, url: str, settings: Settings) -> None:
        super().__init__(url, settings)
        with _LOCK:
            self._store, self._changed = _STORES.setdefault(
                url.rstrip("/"), ({}, threading.Condition())
            )

    def _put(self, task_id: str, content_type: str, data: bytes, expires_at: float | None
             ) -> None:
        with self._changed:
            self._store[task_id] = (content_type, data, expires_at)
            self._changed.notify_all()

    def _get(self, task_ids: Sequence[str]) -> dict[str, tuple[str, bytes]]:
        now = time.time()
        with self._changed:
            found = {t: self._store[t] for t in task_ids if t in self._store}
        return {t: (ct, d) for t, (ct, d, exp) in found.items() if exp is None or exp > now}

    def _wait(self, timeout: float) -> None:
        with self._changed:
            self._changed.wait(timeout)

    def forget(self, task_id: str) -> None:
        with self._changed:
            self._store.pop(task_id, None)

    def cleanup(self) -> int:
        now = time.time()
        with self._changed:
            expired = [t for t, (_, _, exp) in self._store.items() if exp and exp <= now]
            for t in expired:
                del self._store[t]
        return len(expired)
