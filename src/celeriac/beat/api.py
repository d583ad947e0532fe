"""``app.beat``: the entries of a running deployment, changed at runtime.

Every call goes to the shared store, so every beat sees the change at its next tick
(within ``beat_max_loop_interval``) without a restart. Entries configured in
``beat_schedule`` show here before any beat has written them to the store; enabling or
disabling one writes it there. A removed configured entry comes back when a beat that
still configures it next becomes the leader: remove it from the configuration too.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError
from ..stores import SharedStore, open_store, store_url
from . import schedules
from .entries import BeatEntry, bind_tz, parse_entry
from .service import Beat, configured_entries, from_ms
from .step import BeatStep

if TYPE_CHECKING:
    from ..app import Celeriac
    from ..worker.blueprint import Step


class BeatAPI:
    def __init__(self, app: Celeriac, store: SharedStore | None = None) -> None:
        self.app = app
        self._store = store

    def worker_step(self) -> type[Step]:
        """The step that runs a beat on a worker's Timer (``worker -B``). The beat's store
        is checked now: a worker that could not run its beat fails as it starts."""
        store_url(self.app.settings)
        return BeatStep

    @property
    def store(self) -> SharedStore:
        if self._store is None:
            self._store = open_store(self.app.settings)
        return self._store

    def _entries(self) -> dict[str, BeatEntry]:
        stored = {n: BeatEntry.from_json(n, d) for n, d in self.store.entries().items()}
        return {**{n: e for n, e in configured_entries(self.app).items()
                   if n not in stored}, **stored}

    def _get(self, name: str) -> BeatEntry:
        entry = self._entries().get(name)
        if entry is None:
            raise ConfigurationError(f"no beat entry named {name!r}")
        return entry

    def list(self) -> list[dict[str, Any]]:
        """Every entry with its schedule, last and next due time, sorted by name."""
        last = self.store.last_runs()
        now = datetime.now(UTC)
        out = []
        for name, entry in sorted(self._entries().items()):
            row = entry.describe()
            last_ms = last.get(name)
            row["last_run"] = from_ms(last_ms).isoformat() if last_ms is not None else None
            try:
                after = from_ms(last_ms) if last_ms is not None else now
                row["next_run"] = entry.schedule.next_run(after).isoformat()
            except (ValueError, TypeError):
                row["next_run"] = None
            out.append(row)
        return out

    def add(self, name: str, task: str, schedule: Any, args: Sequence[Any] | None = None,
            kwargs: Mapping[str, Any] | None = None,
            options: Mapping[str, Any] | None = None) -> BeatEntry:
        """Add an entry, or replace the definition of one (its last run is kept)."""
        entry = parse_entry(name, {"task": task, "schedule": schedule, "args": args or (),
                                   "kwargs": kwargs or {}, "options": dict(options or {})},
                            source="runtime")
        entry = bind_tz(entry, schedules.app_timezone(self.app.settings))
        self.store.put_entry(name, entry.to_json())
        return entry

    def remove(self, name: str) -> bool:
        """Delete an entry; False if the store had none by that name."""
        return self.store.remove_entry(name)

    def enable(self, name: str) -> BeatEntry:
        return self._set_enabled(name, True)

    def disable(self, name: str) -> BeatEntry:
        return self._set_enabled(name, False)

    def _set_enabled(self, name: str, enabled: bool) -> BeatEntry:
        entry = self._get(name).with_enabled(enabled)
        self.store.put_entry(name, entry.to_json())
        return entry

    def run(self, name: str) -> str:
        """Send entry ``name`` now, outside its schedule; returns the task id."""
        entry = self._get(name)
        beat = Beat(self.app, store=self.store, events=self.app.settings.task_send_sent_event)
        return beat.run_now(entry)

    def leader(self) -> dict[str, Any] | None:
        lease = self.store.leader()
        if lease is None:
            return None
        return {"beat": lease.holder,
                "expires": datetime.fromtimestamp(lease.expires, UTC).isoformat()}

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


_APIS: weakref.WeakKeyDictionary[Celeriac, BeatAPI] = weakref.WeakKeyDictionary()


def api_for(app: Celeriac) -> BeatAPI:
    """``app.beat``: one per app (its store connection is reused)."""
    api = _APIS.get(app)
    if api is None:
        api = _APIS[app] = BeatAPI(app)
    return api
