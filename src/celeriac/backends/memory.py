"""In-process result store for unit tests and eager mode."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .base import ResultBackend, Stored

if TYPE_CHECKING:
    from ..settings import Settings

_LOG_LIMIT = 100_000


@dataclass
class _Chord:
    parts: set[str] = field(default_factory=set)
    fired_by: str | None = None
    """The task id whose count completed the chord."""
    expires_at: float | None = None


@dataclass
class _Store:
    results: dict[str, tuple[str, bytes, float | None]] = field(default_factory=dict)
    changed: threading.Condition = field(default_factory=threading.Condition)
    log: list[str] = field(default_factory=list)
    """Ids in the order they were written; ``log_base`` is the position of ``log[0]``."""
    log_base: int = 0
    chords: dict[str, _Chord] = field(default_factory=dict)
    """``chord_part`` state by group id, guarded by ``changed``'s lock like the results."""

    @property
    def version(self) -> int:
        return self.log_base + len(self.log)


_STORES: dict[str, _Store] = {}
_LOCK = threading.Lock()


class MemoryBackend(ResultBackend):
    scheme = "memory"
    process_local = True
    network = False

    def __init__(self, url: str, settings: Settings) -> None:
        super().__init__(url, settings)
        with _LOCK:
            self._s = _STORES.setdefault(url.rstrip("/"), _Store())
        self._seen = threading.local()

    def store_many(self, items: Sequence[Stored]) -> None:
        s = self._s
        with s.changed:
            for task_id, content_type, data, expires_at in items:
                s.results[task_id] = (content_type, data, expires_at)
                s.log.append(task_id)
            if len(s.log) > _LOG_LIMIT:
                drop = len(s.log) // 2
                del s.log[:drop]
                s.log_base += drop
            s.changed.notify_all()

    def _get(self, task_ids: Sequence[str]) -> dict[str, tuple[str, bytes]]:
        s = self._s
        now = time.time()
        with s.changed:
            self._seen.version = s.version
            found = {t: s.results[t] for t in task_ids if t in s.results}
        return {t: (ct, d) for t, (ct, d, exp) in found.items() if exp is None or exp > now}

    def _changes(self, cursor: int) -> tuple[int, list[str]] | None:
        s = self._s
        with s.changed:
            self._seen.version = s.version
            if cursor < s.log_base:
                return None  # the log was trimmed past the cursor: rescan
            return s.version, s.log[cursor - s.log_base:]

    def _cursor(self) -> int:
        with self._s.changed:
            return self._s.version

    def _wait(self, timeout: float) -> None:
        s = self._s
        seen = getattr(self._seen, "version", -1)
        with s.changed:
            # Sleep only if nothing was written since this thread last read: a write
            # between that read and this wait must not be slept through.
            s.changed.wait_for(lambda: s.version != seen, timeout)

    def forget(self, task_id: str) -> None:
        with self._s.changed:
            self._s.results.pop(task_id, None)

    def chord_part(self, group_id: str, task_id: str, size: int) -> bool:
        s = self._s
        now = time.time()
        expires = self.settings.result_expires
        # One critical section under the store's lock (shared by every instance on this
        # URL in the process): add, count and fire cannot interleave with another call.
        with s.changed:
            chord = s.chords.get(group_id)
            if chord is None or (chord.expires_at is not None and chord.expires_at <= now):
                chord = s.chords[group_id] = _Chord()  # new, or expired: start over
            chord.parts.add(task_id)
            chord.expires_at = now + expires if expires else None
            if chord.fired_by is not None:
                return chord.fired_by == task_id  # the completing task, run again
            if len(chord.parts) < size:
                return False
            chord.fired_by = task_id
            return True

    def cleanup(self) -> int:
        now = time.time()
        s = self._s
        with s.changed:
            expired = [t for t, (_, _, exp) in s.results.items() if exp and exp <= now]
            for t in expired:
                del s.results[t]
            for gid in [g for g, c in s.chords.items() if c.expires_at and c.expires_at <= now]:
                del s.chords[gid]
        return len(expired)
