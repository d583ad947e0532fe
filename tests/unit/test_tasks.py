import pytest

from celeriac import Celeriac, EagerResult, MaxRetriesExceededError, Retry, states
from celeriac.testing import eager


def test_plain_call_runs_the_function(memory_app: Celeriac) -> None:
    @memory_app.task
    def add(x: int, y: int) -> int:
        return x + y

    assert add(2, 3) == 5
    assert add.name == f"{__name__}.test_plain_call_runs_the_function.<locals>.add"
    assert memory_app.tasks[add.name] is add


def test_options_and_names(memory_app: Celeriac) -> None:
    @memory_app.task(name="custom.name", queue="q1", priority=7, acks_late=False,
                     ignore_result=True)
    def f() -> None: ...

    assert f.name == "custom.name"
    assert f.options.queue == "q1" and f.options.priority == 7
    assert f.acks_late is False and f.ignore_result is True


def test_bad_options_are_clear_errors(memory_app: Celeriac) -> None:
    with pytest.raises(ValueError, match="priority must be an int from 0 to 9, got 12"):
        memory_app.task(priority=12)(lambda: None)
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        memory_app.task(colour="red")(lambda: None)  # type: ignore[call-overload]


def test_apply_runs_eagerly_with_retries(memory_app: Celeriac) -> None:
    @memory_app.task(bind=True, max_retries=3)
    def flaky(self, n: int) -> int:  # type: ignore[no-untyped-def]
        if self.request.retries < 2:
            raise self.retry(countdown=10)
        return n * 10

    r = flaky.apply((4,))
    assert isinstance(r, EagerResult)
    assert r.get() == 40 and r.state == states.SUCCESS


def test_apply_failure_keeps_the_real_exception(memory_app: Celeriac) -> None:
    class Custom(Exception):
        pass

    @memory_app.task
    def bad() -> None:
        raise Custom("x")

    r = bad.apply()
    assert r.state == states.FAILURE
    with pytest.raises(Custom):
        r.get()
    assert "raise Custom" in (r.traceback or "")


def test_retry_past_max_retries(memory_app: Celeriac) -> None:
    @memory_app.task(bind=True, max_retries=1)
    def never(self) -> None:  # type: ignore[no-untyped-def]
        raise self.retry(countdown=0)

    with pytest.raises(MaxRetriesExceededError):
        never.apply().get()


def test_retry_called_directly_raises_retry(memory_app: Celeriac) -> None:
    @memory_app.task(bind=True)
    def f(self) -> None:  # type: ignore[no-untyped-def]
        raise self.retry(countdown=1)

    with pytest.raises(Retry):
        f()


def test_always_eager_sends_nothing(memory_app: Celeriac) -> None:
    @memory_app.task
    def add(x: int, y: int) -> int:
        return x + y

    with eager(memory_app):
        assert add.delay(1, 2).get() == 3
    assert memory_app.transport.queue_length("celery") == 0


def test_routing(memory_app: Celeriac) -> None:
    memory_app.configure(task_routes={"billing.*": "billing", "exact.task": "exact"})
    assert memory_app.route("billing.charge") == "billing"
    assert memory_app.route("exact.task") == "exact"
    assert memory_app.route("other") == "celery"

    @memory_app.task(name="billing.charge")
    def charge() -> None: ...

    charge.delay()
    charge.apply_async(queue="override")
    assert memory_app.transport.queue_length("billing") == 1
    assert memory_app.transport.queue_length("override") == 1


def test_apply_async_argument_errors(memory_app: Celeriac) -> None:
    @memory_app.task
    def f(x: int) -> int:
        return x

    with pytest.raises(TypeError, match="args must be a list or tuple, got str"):
        f.apply_async("abc")
    with pytest.raises(ValueError, match="countdown or eta, not both"):
        from datetime import UTC, datetime

        f.apply_async((1,), countdown=1, eta=datetime.now(UTC))
    with pytest.raises(ValueError, match="priority must be an int from 0 to 9"):
        f.apply_async((1,), priority=-1)


def test_delay_many_sends_in_bulk(memory_app: Celeriac) -> None:
    from celeriac.testing import ThreadedWorker

    @memory_app.task
    def add(x: int, y: int = 0) -> int:
        return x + y

    results = add.delay_many([(1, 2), ((3,), {"y": 4}), [5]], )
    assert memory_app.transport.queue_length("celery") == 3
    with ThreadedWorker(memory_app):
        assert [r.get(timeout=5) for r in results] == [3, 7, 5]
    with pytest.raises(TypeError, match="args sequence"):
        memory_app.send_many("x", [42])  # type: ignore[list-item]


def test_routes_by_function(memory_app: Celeriac) -> None:
    memory_app.configure(task_routes=lambda name: "fast" if name.startswith("f.") else None)
    assert memory_app.route("f.x") == "fast"
    assert memory_app.route("g.x") == "celery"
