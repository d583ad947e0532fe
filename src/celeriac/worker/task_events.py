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
- task-revoked: expired on arrival.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import states

if TYPE_CHECKING:
    from ..events import EventDispatcher
    from .execute import Outcome

Final = tuple[str, dict[str, Any]]
"""An event to send once its result is stored: (type, fields)."""


class TaskEvents:
    def __init__(self, dispatcher: EventDispatcher, hide_args: bool) -> None:
        self.dispatcher = dispatcher
        self.hide_args = hide_args

    def send(self, type_: str, fields: dict[str, Any]) -> None:
        self.dispatcher.send(type_, **fields)

    def received(self, headers: dict[str, Any], queue: str) -> None:
        get = headers.get
        if self.hide_args:
            self.dispatcher.send(
                "task-received", uuid=headers["id"], name=headers["task"],
                retries=get("retries") or 0, eta=get("eta"), expires=get("expires"),
                queue=queue, root_id=get("root_id"), parent_id=get("parent_id"))
        else:
            self.dispatcher.send(
                "task-received", uuid=headers["id"], name=headers["task"],
                args=get("argsrepr"), kwargs=get("kwargsrepr"), retries=get("retries") or 0,
                eta=get("eta"), expires=get("expires"), queue=queue,
                root_id=get("root_id"), parent_id=get("parent_id"))

    def started(self, task_id: str) -> None:
        self.dispatcher.send("task-started", uuid=task_id)

    def rejected(self, task_id: str, reason: str, *, requeue: bool) -> None:
        self.dispatcher.send("task-rejected", uuid=task_id, reason=reason, requeue=requeue)

    def expired(self, task_id: str) -> Final:
        return "task-revoked", {"uuid": task_id, "reason": "expired", "expired": True,
                                "terminated": False}

    def failed(self, task_id: str, exception: str, traceback: str | None = None,
               runtime: float = 0.0) -> Final:
        return "task-failed", {"uuid": task_id, "exception": exception,
                               "traceback": traceback, "runtime": runtime}

    def outcome(self, task_id: str, outcome: Outcome) -> Final | None:
        """The event that ends this run of the task, to send after the exchange that
        stores its result; a give-back is sent at once (returns None)."""
        action, state, shown = outcome.action, outcome.state, outcome.shown
        if action == "requeue":
            self.rejected(task_id, outcome.reason or "rejected", requeue=True)
            return None
        if state == states.SUCCESS and action == "ack":
            return "task-succeeded", {"uuid": task_id,
                                      "result": shown[0] if shown else None,
                                      "runtime": outcome.runtime}
        if state == states.RETRY:
            return "task-retried", {"uuid": task_id,
                                    "exception": shown[0] if shown else None,
                                    "traceback": shown[1] if shown else None}
        reason = outcome.reason
        if action == "dead_letter" and (state is None or (reason or "").startswith("rejected")):
            return "task-rejected", {"uuid": task_id, "reason": reason or "rejected",
                                     "requeue": False}
        if state == states.FAILURE:
            return self.failed(task_id, shown[0] if shown else (reason or "failed"),
                               shown[1] if shown else None, outcome.runtime)
        return None  # Ignore: nothing to report
