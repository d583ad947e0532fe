"""Task events from a real worker (``-E``), as an ``EventReceiver`` sees them: each task's
lifecycle in order, what each event carries, arguments left out with events_hide_args."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from celeriac import Celeriac
from celeriac.events import Event, EventReceiver
from celeriac.testing import WorkerProcess, wait_until
from tests.integration import app_tasks as t

pytestmark = pytest.mark.slow

FINAL = {"task-succeeded", "task-failed", "task-rejected", "task-revoked"}


class Collector:
    """An ``EventReceiver`` on a loop in a thread: every task event, by task id."""

    def __init__(self, app: Celeriac) -> None:
        self.app = app
        self.by_task: dict[str, list[Event]] = {}
        self.types: list[str] = []
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._stop = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="collector", daemon=True)

    def __enter__(self) -> Collector:
        self._thread.start()
        assert self._ready.wait(10), "the receiver did not subscribe"
        if self._error:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._thread.join(10)

    def _run(self) -> None:
        async def main() -> None:
            async with EventReceiver(self.app) as receiver:
                self._ready.set()
                while not self._stop:
                    event = await receiver.get(0.2)
                    if event is None:
                        continue
                    with self._lock:
                        self.types.append(event["type"])
                        if "uuid" in event:
                            self.by_task.setdefault(event["uuid"], []).append(event)

        try:
            asyncio.run(main())
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    def lifecycle(self, task_id: str, finals: int = 1) -> list[Event]:
        """The task's events in sending order, once ``finals`` final events came."""
        def complete() -> list[Event] | None:
            with self._lock:
                events = list(self.by_task.get(task_id, ()))
            done = sum(e["type"] in FINAL for e in events)
            return sorted(events, key=lambda e: e["clock"]) if done >= finals else None

        return wait_until(complete, 20, message=f"the final event of {task_id}")


def types(events: list[Event]) -> list[str]:
    return [e["type"] for e in events]


@pytest.fixture
def collect(app: Celeriac) -> Iterator[Collector]:
    with Collector(app) as collector:
        yield collector


def test_each_task_lifecycle_in_order(app: Celeriac, collect: Collector,
                                      start_worker: Callable[..., WorkerProcess]) -> None:
    w = start_worker("-E")
    ok = t.add.delay(2, 3)
    failed = t.boom.delay("value")
    retried = t.always_retry.delay()
    rejected = t.reject_me.delay("not today")
    expired = t.add.apply_async((1, 1), expires=datetime.now(UTC) - timedelta(seconds=1))

    events = collect.lifecycle(ok.id)
    assert types(events) == ["task-received", "task-started", "task-succeeded"]
    received, _, succeeded = events
    assert (received["name"], received["args"], received["kwargs"], received["retries"],
            received["queue"], received["root_id"], received["parent_id"]) == (
        "tests.integration.app_tasks.add", "(2, 3)", "{}", 0, "celery", ok.id, None)
    assert received["eta"] is None and received["expires"] is None
    assert succeeded["result"] == "5" and succeeded["runtime"] >= 0
    assert len({e["hostname"] for e in events}) == 1 and w.log

    events = collect.lifecycle(failed.id)
    assert types(events) == ["task-received", "task-started", "task-failed"]
    assert events[-1]["exception"] == "ValueError('bad value')"
    assert 'raise ValueError("bad value")' in events[-1]["traceback"]

    events = collect.lifecycle(retried.id)
    assert types(events) == ["task-received", "task-started", "task-retried",
                             "task-received", "task-started", "task-failed"]
    assert "KeyError('still broken')" in events[2]["exception"]
    assert events[2]["traceback"]
    assert events[3]["retries"] == 1
    assert events[-1]["exception"] == "KeyError('still broken')"

    events = collect.lifecycle(rejected.id)
    assert types(events) == ["task-received", "task-started", "task-rejected"]
    assert events[-1]["requeue"] is False and "not today" in events[-1]["reason"]

    events = collect.lifecycle(expired.id)
    assert types(events) == ["task-revoked"]
    assert (events[0]["expired"], events[0]["reason"], events[0]["terminated"]) == (
        True, "expired", False)


def test_the_result_is_stored_when_task_succeeded_arrives(
        app: Celeriac, collect: Collector, start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker("-E")
    results = t.add.delay_many([(i, i) for i in range(20)])
    for r in results:
        collect.lifecycle(r.id)
        meta = app.backend.get(r.id)  # read at once: the event follows the store
        assert meta is not None and meta.state == "SUCCESS"


def test_args_are_left_out_with_events_hide_args(
        app: Celeriac, collect: Collector, start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker("-E", extra_env={"CELERIAC_EVENTS_HIDE_ARGS": "1"})
    r = t.add.delay(20, 22)
    received = collect.lifecycle(r.id)[0]
    assert received["type"] == "task-received"
    assert "args" not in received and "kwargs" not in received
    assert received["name"] == "tests.integration.app_tasks.add"


def test_no_task_events_without_dash_e(
        app: Celeriac, collect: Collector, start_worker: Callable[..., WorkerProcess]) -> None:
    w = start_worker()
    results = [t.add.delay(1, 2), t.boom.delay("value")]
    assert results[0].get(timeout=10) == 3
    wait_until(results[1].ready, 10, message="the failure stored")
    w.stop()
    # worker-offline is its last event: whatever it sent before has arrived by then.
    wait_until(lambda: "worker-offline" in collect.types, 10, message="worker-offline")
    with collect._lock:
        seen: dict[str, Any] = dict(collect.by_task)
    assert not seen, seen
