"""Revoked task ids a worker honours, and the ``StateDB`` step that keeps them.

``Revoked`` is Celery's ``LimitedSet`` of revoked ids: at most ``worker_revoke_max``
ids (50,000), each forgotten ``worker_revoke_expires`` seconds (3 hours) after its
revoke; the oldest go first when it is full. Ids are kept as ``id -> expires at`` (wall
clock, so that they can be shared with other workers and written to disk) in a dict
whose insertion order is revoke order.

The consumer's hot path checks ``if revoked.ids and task_id in revoked.ids``: while
nothing is revoked that is one truth test of an empty dict.

Where the ids come from (``StateDB.start``, before the consumer takes any message):
``--statedb PATH`` (a JSON file written when the set changed, at most once a second, and
at shutdown), the shared store (``celeriac.stores``: the revokes recorded by
``app.control.revoke``, reloaded when their version changes, so a worker that missed a
broadcast still honours it within ``REFRESH`` seconds), and, once running, the
``revoke`` broadcast and Mingle's merge of its peers' sets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..control.store import store_for
from ..stores import SharedStore
from .blueprint import Step
from .steps import TimerStep

if TYPE_CHECKING:
    from .timer import Entry

logger = logging.getLogger("celeriac.worker.revoked")

REFRESH = 1.0
"""Seconds between looks at the broker store's version (one cheap read)."""
SAVE_EVERY = 1.0
"""Seconds between writes of a changed statedb."""
PURGE_EVERY = 30.0
"""Seconds between drops of expired ids (a revoke outlives its expiry by at most this)."""


class Revoked:
    def __init__(self, maxlen: int = 50_000, expires: float = 10_800.0) -> None:
        self.maxlen = maxlen
        self.expires = expires
        self.ids: dict[str, float] = {}
        """task id -> when its revoke is forgotten (time.time())."""
        self.terminate: dict[str, str] = {}
        """Ids to kill when they start, with the signal: a revoke with terminate=True
        that found the job waiting in a pool child behind another task."""
        self.dirty = False

    def __contains__(self, task_id: object) -> bool:
        return task_id in self.ids

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, task_id: str, expires_at: float | None = None) -> bool:
        """Remember ``task_id``; True if it is new."""
        now = time.time()
        until = expires_at if expires_at is not None else now + self.expires
        if until <= now:
            return False
        known = self.ids.pop(task_id, None)
        self.ids[task_id] = max(until, known or 0.0)
        self.dirty = True
        if len(self.ids) > self.maxlen:
            self.purge(now)
        return known is None

    def update(self, items: Mapping[str, float] | Iterable[tuple[str, float]]) -> int:
        """Merge ``id -> expires at`` pairs (a peer's set, a file, the store); returns
        how many were new."""
        pairs = items.items() if isinstance(items, Mapping) else items
        return sum(1 for task_id, until in pairs
                   if isinstance(task_id, str) and isinstance(until, (int, float))
                   and self.add(task_id, float(until)))

    def purge(self, now: float | None = None) -> int:
        """Drop expired ids, then the oldest beyond ``maxlen``; returns how many."""
        now = time.time() if now is None else now
        before = len(self.ids)
        expired = [i for i, until in self.ids.items() if until <= now]
        for task_id in expired:
            del self.ids[task_id]
        excess = len(self.ids) - self.maxlen
        if excess > 0:
            for task_id in list(self.ids)[:excess]:
                del self.ids[task_id]
        if len(self.ids) != before:
            self.dirty = True
        for task_id in [t for t in self.terminate if t not in self.ids]:
            del self.terminate[task_id]
        return before - len(self.ids)

    def as_dict(self) -> dict[str, float]:
        return dict(self.ids)


def load_statedb(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        logger.error("statedb %s cannot be read (%s); starting without it", path, exc)
        return {}
    return data if isinstance(data, dict) else {}


def save_statedb(path: str, revoked: Revoked, clock: int) -> None:
    # Written beside and renamed over: a crash mid-write leaves the last good file.
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"revoked": revoked.as_dict(), "clock": clock}, f)
    os.replace(tmp, path)


class StateDB(Step):
    """Celery's ``StateDB`` step: the worker's ``Revoked`` set (``worker.revoked``),
    loaded from ``--statedb`` and the broker store before the consumer starts, saved
    when it changes and at shutdown."""

    requires = (TimerStep,)

    async def start(self) -> None:
        w = self.worker
        s = w.app.settings
        maxlen = int(os.environ.get("CELERY_WORKER_REVOKES_MAX", s.worker_revoke_max))
        expires = float(os.environ.get("CELERY_WORKER_REVOKE_EXPIRES",
                                       s.worker_revoke_expires))
        self.revoked = w.revoked = Revoked(maxlen, expires)
        self.path: str | None = getattr(w, "statedb", None) or s.worker_state_db
        self.clock = 0
        if self.path:
            data = load_statedb(self.path)
            self.clock = int(data.get("clock") or 0)
            loaded = self.revoked.update(data.get("revoked") or {})
            logger.info("statedb %s: %d revoked id(s)", self.path, loaded)
        self.store: SharedStore | None = store_for(w.app)
        self.version: object = None
        self._entries: list[Entry] = []
        read_only = s.worker_remote_control == "read-only"
        if self.store is not None and not read_only:
            # The first load on the loop itself: nothing else may run before it (no task
            # starts until the revoked ids are in), and a thread would cost the start its
            # creation and two hand-overs (issue 30). Later loads go to a thread.
            self.load_now()
            self._entries.append(w.timer.call_repeatedly(REFRESH, self.refresh))
        if self.path:
            self._entries.append(w.timer.call_repeatedly(SAVE_EVERY, self.save_if_dirty))
        self._entries.append(w.timer.call_repeatedly(PURGE_EVERY, self.revoked.purge))
        self.revoked.dirty = False

    async def refresh(self) -> None:
        """Load the broker store's revokes when its version moved (the read in a
        thread: the store is a synchronous client; the set is changed on the loop)."""
        assert self.store is not None
        try:
            version, items = await asyncio.to_thread(self.store.load_if_changed,
                                                     self.version)
        except Exception as exc:
            self._unreadable(exc)
            return
        self._apply(version, items)

    def load_now(self) -> None:
        """``refresh``, the read on the loop itself."""
        assert self.store is not None
        try:
            version, items = self.store.load_if_changed(self.version)
        except Exception as exc:
            self._unreadable(exc)
            return
        self._apply(version, items)

    def _unreadable(self, exc: Exception) -> None:
        if self.version is not None:
            logger.debug("revoked store unreadable (%s); trying again", exc)

    def _apply(self, version: object, items: Mapping[str, float] | None) -> None:
        if items is not None:
            new = self.revoked.update(items)
            if new:
                logger.info("%d revoked id(s) from the shared store", new)
        self.version = version

    def save_if_dirty(self) -> None:
        if self.path and self.revoked.dirty:
            self.save()

    def save(self) -> None:
        assert self.path is not None
        events = self.worker.events
        clock = events.clock.value if events is not None else self.clock
        try:
            save_statedb(self.path, self.revoked, clock)
            self.revoked.dirty = False
        except OSError as exc:
            logger.error("statedb %s cannot be written: %s", self.path, exc)

    async def stop(self) -> None:
        for entry in self._entries:
            entry.cancel()
        if self.path:
            self.revoked.purge()
            self.save()
        if self.store is not None:
            with contextlib.suppress(Exception):
                self.store.close()
