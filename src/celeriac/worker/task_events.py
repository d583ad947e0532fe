"""Task events from the worker's main process, where they cost least.

The consumer already holds what the events carry: the headers it read on arrival
(name, argument reprs, retries, eta, expires, lineage) and the outcome the pool reported
(state, runtime, and, only while task events are on, the result's or the exception's
repr and traceback, made in the process that ran the task). With task events off the
consumer holds no ``TaskEvents`` and none of this runs.

What is sent, by the consumer's steps (see ``celeriac.events`` for the wire format):

- task-received: a message became a job (reserved);
- task-started: the job went to the pool (which starts it at once: it only takes jobs
  for idle children);
- task-succeeded / task-failed / task-retried: after the exchange that stored the
  result, so a monitor that reads the result on this event finds it;
- task-rejected: dead-lettered (malformed body, unknown task, ``Reject``) or given back
  (``Reject(requeue=True)``, a lost child's job redelivered);
- task-revoked: expired on arrival;
- task-progress (ours; Celery has none): the running task called ``update_state``,
  with ``state`` and ``meta`` (JSON up to 1 KiB, else a short repr); throttled to one
  per 0.1 s per task where the task runs (``celeriac.runtime.progress``). Sent at once: the
  last one precedes the task's final event. ``meta`` is kept with
  ``events_hide_args`` (it is what the task chose to publish, not its arguments).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import states

if TYPE_CHECKING:
    from ..events import Event, EventDispatcher
    from .execute import Outcome


class TaskEvents:
    """Builds each event as a dict literal with its type and timestamp and appends it to
    a list, which goes to ``EventDispatcher.put_many`` (one lock for all of it) in a
    callback scheduled on the loop when the list stops being empty: so whatever one turn
    of the loop produced leaves together, right after that turn, wherever it came from
    (the consumer's pump, the pool's callbacks, a shutdown). A lock per event would cost
    the loop more than the event."""

    def __init__(self, dispatcher: EventDispatcher, hide_args: bool) -> None:
        self.dispatcher = dispatcher
        self.hide_args = hide_args
        self.queued: list[Event] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        """Set when the consumer starts; until then events go to the dispatcher at once."""

    def put(self, event: Event) -> None:
        self.put_all((event,))

    def put_all(self, events: Sequence[Event]) -> None:
        if not events:
            return
        if not self.queued:
            if self.loop is None:
                self.dispatcher.put_many(events)
                return
            self.loop.call_soon(self.flush)
        self.queued.extend(events)

    def flush(self) -> None:
        """Hand what was queued since the last flush to the dispatcher, in order."""
        if self.queued:
            self.dispatcher.put_many(self.queued)
            self.queued.clear()

    def received(self, headers: dict[str, Any], queue: str) -> None:
        get = headers.get
        event = {"type": "task-received", "uuid": headers["id"], "name": headers["task"],
                 "retries": get("retries") or 0, "eta": get("eta"),
                 "expires": get("expires"), "queue": queue, "root_id": get("root_id"),
                 "parent_id": get("parent_id"), "timestamp": time.time()}
        if not self.hide_args:
            event["args"] = get("argsrepr")
            event["kwargs"] = get("kwargsrepr")
        self.put(event)

    def started(self, task_id: str) -> None:
        self.put({"type": "task-started", "uuid": task_id, "timestamp": time.time()})

    def progress(self, task_id: str, state: str, meta: Any) -> None:
        self.put({"type": "task-progress", "uuid": task_id, "state": state, "meta": meta,
                  "timestamp": time.time()})

    def rejected(self, task_id: str, reason: str, *, requeue: bool) -> None:
        self.put({"type": "task-rejected", "uuid": task_id, "reason": reason,
                  "requeue": requeue, "timestamp": time.time()})

    # The events below end a run of the task: the consumer holds them until the exchange
    # that stores the result, then hands them to ``put``.
    def expired(self, task_id: str) -> Event:
        return {"type": "task-revoked", "uuid": task_id, "reason": "expired",
                "expired": True, "terminated": False, "timestamp": time.time()}

    def failed(self, task_id: str, exception: str, traceback: str | None = None,
               runtime: float = 0.0) -> Event:
        return {"type": "task-failed", "uuid": task_id, "exception": exception,
                "traceback": traceback, "runtime": runtime, "timestamp": time.time()}

    def outcome(self, task_id: str, outcome: Outcome) -> Event | None:
        """The event that ends this run of the task, to send after the exchange that
        stores its result; a give-back is sent at once (returns None)."""
        action, state, shown = outcome.action, outcome.state, outcome.shown
        if action == "requeue":
            self.rejected(task_id, outcome.reason or "rejected", requeue=True)
            return None
        if state == states.SUCCESS and action == "ack":
            return {"type": "task-succeeded", "uuid": task_id,
                    "result": shown[0] if shown else None, "runtime": outcome.runtime,
                    "timestamp": time.time()}
        if state == states.RETRY:
            return {"type": "task-retried", "uuid": task_id,
                    "exception": shown[0] if shown else None,
                    "traceback": shown[1] if shown else None, "timestamp": time.time()}
        reason = outcome.reason
        if action == "dead_letter" and (state is None or (reason or "").startswith("rejected")):
            return {"type": "task-rejected", "uuid": task_id,
                    "reason": reason or "rejected", "requeue": False,
                    "timestamp": time.time()}
        if state == states.FAILURE:
            return self.failed(task_id, shown[0] if shown else (reason or "failed"),
                               shown[1] if shown else None, outcome.runtime)
        return None  # Ignore: nothing to report
