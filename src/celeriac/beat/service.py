"""``Beat``: the scheduler. One ``tick()`` does everything a beat does, and returns how
long to sleep before the next one:

1. take or renew the beat lease (``SharedStore.acquire(BEAT_LEASE, ...)``); a beat that
   does not hold it does nothing else, and tries again a third of ``beat_lease_timeout``
   later;
2. a beat that has just become the leader writes its configured entries
   (``beat_schedule``, ``add_periodic_task``) into the store and sends ``beat-leader``;
3. for each enabled entry in the store: the due times between its last due time and
   now (the "windows"), reduced by the missed-runs policy (``once``: the latest; ``all``:
   each, at most ``MAX_WINDOWS``; ``skip``: the latest if it is on time, none otherwise),
   then for each one: claim its run key (``SharedStore.claim``: refused unless this beat
   still holds the lease and nobody claimed that due time), and only then send it.

Claim before send makes it at most once per due time: a beat killed between the two
loses that one run (logged as claimed by the next leader's ledger) instead of sending
it twice. A new entry starts counting when a leader first sees it (an interval entry
first runs one interval later: Celery's behaviour).

``clock`` (unix seconds) may be a test's fake clock; nothing here sleeps.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..errors import CeleriacError
from ..events import EventDispatcher
from ..stores import BEAT_LEASE, SharedStore, open_store, run_key
from . import schedules
from .entries import BeatEntry, bind_tz, entries_from_settings

if TYPE_CHECKING:
    from ..app import Celeriac

logger = logging.getLogger("celeriac.beat")

MAX_WINDOWS = 1000
"""``missed_runs="all"`` sends at most this many missed windows per entry and tick."""
MAX_SCAN = 20_000
"""Windows counted one by one before the count jumps close to now."""
RUN_ID_NAMESPACE = uuid.UUID("6f0c2b1e-4d8a-5b7c-9e3f-0a1b2c3d4e5f")


def task_id_for(name: str, due_ms: int) -> str:
    """The task id of run ``name@due_ms``: the same for every beat, so a run key and
    its task (and result) name each other."""
    return str(uuid.uuid5(RUN_ID_NAMESPACE, run_key(name, due_ms)))


def to_ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


def from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def windows(schedule: Any, last: datetime, now: datetime,
            cap: int = MAX_WINDOWS) -> tuple[list[datetime], int]:
    """Due times after ``last`` up to ``now``: the latest ``cap`` of them, and how many
    earlier ones were left out."""
    kept: deque[datetime] = deque(maxlen=cap)
    count, t = 0, last
    while True:
        nxt = schedule.next_run(t)
        if nxt <= t:
            raise ValueError(f"schedule {schedule} does not move forward from {t}")
        if nxt > now:
            break
        kept.append(nxt)
        count += 1
        t = nxt
        if count == MAX_SCAN and len(kept) >= 2:
            # A long outage on a short schedule: skip to ~cap windows before now rather
            # than step through every one (the skipped ones are dropped either way).
            gap = kept[-1] - kept[-2]
            jump = now - gap * (cap + 1)
            if jump > t:
                count += int((jump - t) / gap)
                t = jump
    return list(kept), count - len(kept)


def default_hostname() -> str:
    return f"beat@{socket.gethostname()}"


class Beat:
    def __init__(self, app: Celeriac, *, store: SharedStore | None = None,
                 hostname: str | None = None, clock: Callable[[], float] = time.time,
                 events: bool = True, max_interval: float | None = None) -> None:
        settings = app.settings
        self.app = app
        self.store = store or open_store(settings)
        self.hostname = hostname or default_hostname()
        self.id = f"{self.hostname}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        """This beat's lease holder id (host, pid, a random suffix: never reused)."""
        self.clock = clock
        self.lease_timeout = settings.beat_lease_timeout
        self.max_interval = max_interval or settings.beat_max_loop_interval
        self.missed_runs = settings.beat_missed_runs
        self.leading = False
        self.sent = 0
        """Runs this beat sent."""
        self.refused = 0
        """Runs whose claim was refused (another beat had them, or the lease was lost)."""
        self._events_on = events
        self._events: EventDispatcher | None = None

    def __repr__(self) -> str:
        return f"<Beat {self.id} {'leading' if self.leading else 'waiting'}>"

    @property
    def renew_interval(self) -> float:
        return self.lease_timeout / 3

    # -- the loop's one step ------------------------------------------------------------
    def tick(self) -> float:
        """Renew or take the lease and, leading, send what is due; seconds to sleep."""
        leading = self.store.acquire(BEAT_LEASE, self.id, self.lease_timeout)
        if leading != self.leading:
            self.leading = leading
            self._leader_changed()
        wait = min(self.renew_interval, self.max_interval)
        if not leading:
            return wait
        last = self.store.last_runs()
        for entry in self.load().values():
            if entry.enabled:
                wait = min(wait, self._entry_tick(entry, last.get(entry.name)))
        return max(0.0, wait)

    def _leader_changed(self) -> None:
        if self.leading:
            logger.warning("beat %s leads now (lease %gs)", self.id, self.lease_timeout)
            self.sync_config()
        else:
            logger.warning("beat %s lost the lease; waiting to take it again", self.id)
        self.send_event("beat-leader", beat=self.id, leading=self.leading)

    def load(self) -> dict[str, BeatEntry]:
        """The store's entries (one that cannot be read is logged and left out)."""
        out: dict[str, BeatEntry] = {}
        for name, data in self.store.entries().items():
            try:
                out[name] = BeatEntry.from_json(name, data)
            except (CeleriacError, ValueError, KeyError, TypeError) as exc:
                logger.error("beat entry %r cannot be read, skipped: %s", name, exc)
        return out

    def sync_config(self) -> None:
        """Write this app's configured entries into the store: new ones, and changed
        definitions (keeping their enabled flag); drop config entries no longer
        configured. Entries added at runtime are left alone."""
        configured = configured_entries(self.app)
        stored = self.load()
        for name, entry in configured.items():
            old = stored.get(name)
            if old is not None and old.source == "runtime":
                continue
            if old is not None:
                entry = entry.with_enabled(old.enabled)
            if old is None or old.to_json() != entry.to_json():
                self.store.put_entry(name, entry.to_json())
        for name, old in stored.items():
            if old.source == "config" and name not in configured:
                logger.info("beat entry %r is no longer configured: removed", name)
                self.store.remove_entry(name)

    def _entry_tick(self, entry: BeatEntry, last_ms: int | None) -> float:
        """Send what ``entry`` has due; seconds until its next due time."""
        schedule = entry.schedule
        now = from_ms(to_ms(datetime.fromtimestamp(self.clock(), UTC)))
        if last_ms is None:
            self.store.advance(self.id, entry.name, to_ms(now))
            return self._until(schedule.next_run(now))
        due, dropped = windows(schedule, from_ms(last_ms), now)
        if not due:
            return self._until(schedule.next_run(from_ms(last_ms)))
        policy = entry.missed_runs or self.missed_runs
        missed = len(due) + dropped - 1
        grace = timedelta(seconds=self.max_interval)
        if policy == "all":
            if dropped:
                logger.warning("beat entry %r: %d missed runs beyond the %d sent were "
                               "dropped (missed_runs='all' is capped)", entry.name, dropped,
                               MAX_WINDOWS)
            send = due
        elif policy == "skip" and now - due[-1] > grace:
            logger.warning("beat entry %r: %d missed run(s) skipped (missed_runs='skip')",
                           entry.name, missed + 1)
            self.store.advance(self.id, entry.name, to_ms(due[-1]))
            send = []
        else:
            if missed:
                logger.warning("beat entry %r: %d missed run(s); sending %s once",
                               entry.name, missed, "the latest" if policy == "once" else
                               "the current one")
            send = due[-1:]
        for moment in send:
            self._send(entry, schedule, moment)
        return self._until(schedule.next_run(due[-1]))

    def _until(self, moment: datetime) -> float:
        return max(0.0, moment.timestamp() - self.clock())

    def _send(self, entry: BeatEntry, schedule: Any, due: datetime) -> bool:
        due_ms = to_ms(due)
        key = run_key(entry.name, due_ms)
        if not self.store.claim(self.id, entry.name, due_ms):
            # Another beat sent it, or this one lost its lease while it worked.
            self.refused += 1
            logger.info("run %s not sent: its claim was refused", key)
            return False
        options = entry.send_options()
        if "expires" not in options:
            # Stale periodic work should not pile up behind an outage: a run expires
            # when the next one is due (counted from now: a late send still gets it all).
            options["expires"] = (schedule.next_run(due) - due).total_seconds()
        task_id = task_id_for(entry.name, due_ms)
        try:
            self.app.send_task(entry.task, entry.args, entry.kwargs, task_id=task_id,
                               **options)
        except Exception:
            # The claim stands (never twice): this run is lost, and says so.
            logger.exception("run %s was claimed but could not be sent", key)
            return False
        self.sent += 1
        logger.info("sent %s (%s) as %s", key, entry.task, task_id)
        self.send_event("beat-sent", entry=entry.name, task=entry.task, task_id=task_id,
                        due=due.isoformat(), run_key=key, beat=self.id)
        return True

    def run_now(self, entry: BeatEntry) -> str:
        """Send ``entry`` now, outside its schedule (no run key: not a due time)."""
        result = self.app.send_task(entry.task, entry.args, entry.kwargs,
                                    **entry.send_options())
        self.send_event("beat-sent", entry=entry.name, task=entry.task, task_id=result.id,
                        due=None, run_key=None, beat=self.id)
        return result.id

    # -- events -------------------------------------------------------------------------
    def send_event(self, type_: str, **fields: Any) -> None:
        if not self._events_on:
            return
        if self._events is None:
            self._events = EventDispatcher(self.app, hostname=self.hostname,
                                           groups=("beat",), buffer_groups=())
        self._events.send(type_, **fields)

    def close(self) -> None:
        """Give the lease up (a successor takes over at once) and close connections."""
        try:
            if self.leading:
                self.store.release(BEAT_LEASE, self.id)
                self.leading = False
                logger.warning("beat %s released the lease", self.id)
                self.send_event("beat-leader", beat=self.id, leading=False)
        except CeleriacError as exc:
            logger.warning("beat %s could not release its lease: %s", self.id, exc)
        finally:
            if self._events is not None:
                self._events.close()
                self._events = None
            self.store.close()


def configured_entries(app: Celeriac) -> dict[str, BeatEntry]:
    """``beat_schedule`` and the entries of ``add_periodic_task`` (which win)."""
    entries = entries_from_settings(app.settings.beat_schedule)
    entries.update(getattr(app, "_periodic", {}))
    tz = schedules.app_timezone(app.settings)
    return {name: bind_tz(entry, tz) for name, entry in entries.items()}
