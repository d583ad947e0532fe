"""What the executing process adds for task events, and that it adds nothing when they
are off (the worker's main process then holds no ``TaskEvents`` at all)."""

from __future__ import annotations

import asyncio

from celeriac import Celeriac, producer
from celeriac.testing import ThreadedWorker
from celeriac.worker.execute import EXCEPTION_REPR, RESULT_REPR, Job, Shown, execute


def _shown(app: Celeriac, name: str, *args: object, task_events: bool) -> Shown | None:
    message, _, _ = producer.build(app, name, args, None, producer.SendOptions())
    job = Job(1, message.headers, message.body, message.content_type, "celery", 1, "host")
    return execute(app, job, task_events).shown


def test_outcomes_carry_reprs_only_with_task_events(memory_app: Celeriac) -> None:
    @memory_app.task(name="ok")
    def ok(n: int) -> list[int]:
        return list(range(n))

    @memory_app.task(name="bad")
    def bad() -> None:
        raise ValueError("x" * 5000)

    assert _shown(memory_app, "ok", 3, task_events=False) is None
    assert _shown(memory_app, "bad", task_events=False) is None
    assert _shown(memory_app, "ok", 3, task_events=True) == ("[0, 1, 2]", None)
    long = _shown(memory_app, "ok", 10_000, task_events=True)
    assert long is not None and len(long[0]) <= RESULT_REPR
    shown = _shown(memory_app, "bad", task_events=True)
    assert shown is not None and shown[0].startswith("ValueError('xxx")
    assert len(shown[0]) <= EXCEPTION_REPR
    assert shown[1] is not None and "raise ValueError" in shown[1]


def test_no_task_events_object_without_task_events(memory_app: Celeriac) -> None:
    with ThreadedWorker(memory_app) as off:
        assert off.worker.consumer.events is None
        assert not off.worker.pool.task_events
    with ThreadedWorker(memory_app, task_events=True) as on:
        assert on.worker.consumer.events is not None
        assert on.worker.pool.task_events


class _Recorder:
    """Stands in for the dispatcher: records what is handed over, and in how many calls."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def put(self, event: dict[str, object]) -> bool:
        self.calls.append([str(event["type"])])
        return True

    def put_many(self, events: list[dict[str, object]]) -> int:
        self.calls.append([str(e["type"]) for e in events])
        return len(events)


def test_events_of_one_loop_turn_leave_together_whoever_made_them() -> None:
    """A task-started made by a pool callback (a child came up), with the consumer's pump
    asleep, still leaves right after that turn of the loop, with what came beside it."""
    from celeriac.worker.task_events import TaskEvents

    recorder = _Recorder()
    events = TaskEvents(recorder, hide_args=False)  # type: ignore[arg-type]
    events.started("before-the-loop")              # no loop yet: handed over at once
    assert recorder.calls == [["task-started"]]

    async def main() -> None:
        events.loop = asyncio.get_running_loop()
        events.started("t1")
        events.rejected("t2", "lost", requeue=True)
        assert recorder.calls == [["task-started"]]  # not yet: the turn is not over
        await asyncio.sleep(0)  # sleep-ok: yield to the loop
        assert recorder.calls[1:] == [["task-started", "task-rejected"]]
        events.put_all([events.failed("t3", "ValueError()")])
        await asyncio.sleep(0)  # sleep-ok: yield to the loop
        assert recorder.calls[2:] == [["task-failed"]]

    asyncio.run(main())
