"""What the executing process adds for task events, and that it adds nothing when they
are off (the worker's main process then holds no ``TaskEvents`` at all)."""

from __future__ import annotations

from celeriac import Celeriac
from celeriac.testing import ThreadedWorker
from celeriac.worker.execute import EXCEPTION_REPR, RESULT_REPR, execute_message


def _run(app: Celeriac, name: str, *args: object, task_events: bool) -> tuple[object, ...]:
    message, _, _ = app._build(
        name, args, None, countdown=None, eta=None, expires=None, queue=None, priority=None,
        task_id=None, headers=None, serializer=None, retries=0, time_limit=None,
        soft_time_limit=None, ignore_result=False)
    return execute_message(app, message.headers, message.body, message.content_type,
                           "celery", 1, "host", task_events)


def test_outcomes_carry_reprs_only_with_task_events(memory_app: Celeriac) -> None:
    @memory_app.task(name="ok")
    def ok(n: int) -> list[int]:
        return list(range(n))

    @memory_app.task(name="bad")
    def bad() -> None:
        raise ValueError("x" * 5000)

    assert _run(memory_app, "ok", 3, task_events=False)[5] is None
    assert _run(memory_app, "bad", task_events=False)[5] is None
    assert _run(memory_app, "ok", 3, task_events=True)[5] == ("[0, 1, 2]", None)
    long = _run(memory_app, "ok", 10_000, task_events=True)[5]
    assert long is not None and len(long[0]) <= RESULT_REPR
    shown = _run(memory_app, "bad", task_events=True)[5]
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
