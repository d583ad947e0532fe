"""Celery's task API where its integration suite uses it: ``typing`` (the call-time
argument check), ``pydantic=True``, ``Task.replace``, and the call options."""

from __future__ import annotations

import sys
import types
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from celeriac import Celeriac, chain, group
from celeriac.canvas import chord
from celeriac.errors import ConfigurationError
from celeriac.hooks import Hooks
from celeriac.protocol import Message
from celeriac.testing import ThreadedWorker


def make_app(**settings: Any) -> Celeriac:
    url = f"memory://{uuid.uuid4().hex}"
    return Celeriac(f"t{uuid.uuid4().hex[:6]}", broker=url, backend=url, **settings)


@pytest.fixture
def app() -> Iterator[Celeriac]:
    a = make_app()
    yield a
    a.close()


# -- typing -------------------------------------------------------------------------------
def test_typing_checks_arguments_where_the_task_is_sent(app: Celeriac) -> None:
    @app.task
    def add(x: int, y: int = 0, *, z: int = 0) -> int:
        return x + y + z

    @app.task(bind=True)
    def bound(self: Any, x: int) -> int:
        return x

    with pytest.raises(TypeError, match="missing 1 required positional argument: 'x'"):
        add.delay()
    with pytest.raises(TypeError, match="unexpected keyword argument 'w'"):
        add.apply_async((1,), {"w": 1})
    with pytest.raises(TypeError, match="takes 1 positional argument but 2"):
        bound.delay(1, 2)  # the task itself is not counted
    assert app.transport.queue_length("celery") == 0  # nothing was sent
    add.apply_async((1, 2), {"z": 3})
    bound.delay(1)
    assert app.transport.queue_length("celery") == 2


def test_typing_false_sends_what_it_is_given(app: Celeriac) -> None:
    @app.task(typing=False)
    def add(x: int, y: int) -> int:
        return x + y

    assert add.options.typing is False
    result = add.delay(1)
    with ThreadedWorker(app), pytest.raises(TypeError):
        result.get(timeout=5)


# -- pydantic -----------------------------------------------------------------------------
class _Model:
    """Enough of pydantic's BaseModel for the wrapper: model_validate, model_dump."""

    fields: tuple[str, ...] = ()

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)

    @classmethod
    def model_validate(cls, value: Any, strict: bool = False, context: Any = None) -> Any:
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict) or set(value) != set(cls.fields):
            raise ValueError(f"not a {cls.__name__}: {value!r}")
        return cls(**value)

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.fields}


class Params(_Model):
    fields = ("x", "y")


class Total(_Model):
    fields = ("result",)


@pytest.fixture
def fake_pydantic(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("pydantic")
    module.BaseModel = _Model  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pydantic", module)


def test_pydantic_converts_arguments_and_dumps_the_result(app: Celeriac,
                                                          fake_pydantic: None) -> None:
    @app.task(pydantic=True)
    def add(data: Params, scale: int = 1) -> Total:
        assert isinstance(data, Params)
        return Total(result=(data.x + data.y) * scale)

    @app.task(pydantic=True, bind=True)
    def bound(self: Any, data: Params | None = None) -> Params | None:
        return data

    with ThreadedWorker(app):
        assert add.delay({"x": 1, "y": 2}, scale=2).get(timeout=5) == {"result": 6}
        assert bound.delay({"x": 1, "y": 1}).get(timeout=5) == {"x": 1, "y": 1}
        assert bound.delay(None).get(timeout=5) is None
    assert add.apply(({"x": 2, "y": 2},)).get() == {"result": 4}


def test_pydantic_missing_is_a_clear_error_where_the_task_runs(
        app: Celeriac, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pydantic", None)  # as if not installed

    @app.task(pydantic=True)  # defining it needs no pydantic
    def add(data: Any) -> Any:
        return data

    with pytest.raises(ConfigurationError, match="install pydantic"):
        add.apply(({"x": 1},), ).get()


# -- Task.replace --------------------------------------------------------------------------
def replacing_tasks(app: Celeriac) -> dict[str, Any]:
    @app.task(name="add")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="ident")
    def ident(x: Any) -> Any:
        return x

    @app.task(name="rep", bind=True)
    def rep(self: Any, x: int, y: int) -> Any:
        raise self.replace(add.s(x, y))

    @app.task(name="rep_chain", bind=True)
    def rep_chain(self: Any, x: int) -> Any:
        return self.replace(chain(add.s(x, 1), add.s(10)))

    @app.task(name="rep_group", bind=True)
    def rep_group(self: Any, x: int) -> Any:
        raise self.replace(group(add.s(x, 1), add.s(x, 2)))

    @app.task(name="nesting", bind=True)
    def nesting(self: Any) -> int:
        return int(self.request.replaced_task_nesting)

    @app.task(name="rep_twice", bind=True)
    def rep_twice(self: Any) -> Any:
        raise self.replace(rep_nesting.s())

    @app.task(name="rep_nesting", bind=True)
    def rep_nesting(self: Any) -> Any:
        raise self.replace(nesting.s())

    @app.task(name="rep_empty", bind=True)
    def rep_empty(self: Any) -> Any:
        raise self.replace(chain())

    return dict(locals())


def test_replace_takes_the_tasks_place(app: Celeriac) -> None:
    t = replacing_tasks(app)
    add, ident, rep, rep_chain, rep_group = (t[n] for n in ("add", "ident", "rep",
                                                            "rep_chain", "rep_group"))
    with ThreadedWorker(app):
        result = rep.delay(1, 2)
        assert result.get(timeout=5) == 3  # the replacement's result, under this task's id
        assert rep_chain.delay(1).get(timeout=5) == 12
        assert rep_group.delay(1).get(timeout=5) == [2, 3]  # a group: its results' list
        # The rest of the chain runs after the replacement, given its result.
        assert chain(ident.s(1), rep.s(5), add.s(100)).delay().get(timeout=5) == 106
        assert chain(ident.s(1), rep_chain.s(), add.s(100)).delay().get(timeout=5) == 112
        assert chain(rep_group.s(1), ident.s()).delay().get(timeout=5) == [2, 3]
        # In a chord's header, the replacement counts the member's part.
        assert chord([rep.s(1, 1), add.s(2, 2)], ident.s()).delay().get(timeout=5) == [2, 4]
        assert chord([rep_group.s(1), add.s(2, 2)], ident.s()).delay().get(
            timeout=5) == [[2, 3], 4]
        assert chord([rep_chain.s(1), add.s(2, 2)], ident.s()).delay().get(
            timeout=5) == [12, 4]
        assert group(rep.s(1, 1), add.s(2, 2)).delay().get(timeout=5) == [2, 4]
        assert t["rep_twice"].delay().get(timeout=5) == 2  # replaced_task_nesting


def test_replace_keeps_the_callbacks(app: Celeriac) -> None:
    t = replacing_tasks(app)
    seen: list[Any] = []

    @app.task(name="record")
    def record(value: Any) -> None:
        seen.append(value)

    @app.task(name="fail_rep", bind=True)
    def fail_rep(self: Any) -> Any:
        raise self.replace(boom.s())

    @app.task(name="boom")
    def boom() -> None:
        raise ValueError("boom")

    with ThreadedWorker(app):
        result = t["rep"].apply_async((1, 2), link=record.s())
        assert result.get(timeout=5) == 3
        failed = fail_rep.apply_async(link_error=record.si("errback"))
        with pytest.raises(ValueError):
            failed.get(timeout=5)
        from celeriac.testing import wait_until
        wait_until(lambda: len(seen) == 2, 5, message="callbacks ran")
    assert sorted(map(str, seen)) == ["3", "errback"]


def test_replace_eagerly_returns_the_value(app: Celeriac) -> None:
    t = replacing_tasks(app)
    # Celery's rule: eagerly, replace() returns the value (use ``return self.replace``).
    assert t["rep_chain"].apply((1,)).get() == 12
    with pytest.raises(ConfigurationError, match="empty chain"):
        t["rep_empty"].apply().get()


# -- call options -------------------------------------------------------------------------
def test_class_based_task_made_bare(app: Celeriac) -> None:
    from celeriac import Task

    app.set_current()

    class Flaky(Task):  # type: ignore[type-arg]
        name = "flaky_class_task"
        autoretry_for = (ValueError,)
        retry_kwargs = {"max_retries": 1}
        retry_backoff = False
        default_retry_delay = 0.01

        def run(self) -> int:
            if self.request.retries:
                return int(self.request.retries)
            raise ValueError()

    task = Flaky()
    assert task.app is app and task.name == "flaky_class_task"
    assert app.register_task(task) is task
    assert app.tasks["flaky_class_task"] is task
    with ThreadedWorker(app):
        assert task.delay().get(timeout=5) == 1


def test_retry_kwargs_are_what_autoretry_retries_with(app: Celeriac) -> None:
    @app.task(autoretry_for=(KeyError,), retry_kwargs={"max_retries": 0})
    def once() -> None:
        raise KeyError("k")

    assert isinstance(once.apply().get(propagate=False), KeyError)  # no retry


def test_throw_and_link_error_eagerly(app: Celeriac) -> None:
    seen: list[Any] = []

    @app.task(name="fails")
    def fails() -> None:
        raise KeyError("k")

    @app.task(name="new_style")
    def new_style(request: Any, exc: BaseException, traceback: str | None) -> None:
        seen.append(("new", request.id, type(exc).__name__))

    @app.task(name="old_style")
    def old_style(task_id: str) -> None:
        seen.append(("old", task_id))

    result = fails.apply(link_error=[new_style.s(), old_style.s()])
    assert isinstance(result.get(propagate=False), KeyError)
    assert seen == [("new", result.id, "KeyError"), ("old", result.id)]
    with pytest.raises(KeyError):
        fails.apply(throw=True)
    app.configure(task_always_eager=True)
    with pytest.raises(KeyError):
        fails.apply_async(throw=True)
    assert isinstance(fails.apply_async(throw=False).get(propagate=False), KeyError)
    with pytest.raises(TypeError, match="unknown option"):
        fails.apply(nonsense=1)


def test_argsrepr_kwargsrepr_override_the_headers(app: Celeriac) -> None:
    sent: list[Message] = []

    class Capture(Hooks):
        def before_publish(self, message: Message, queue: str) -> None:
            sent.append(message)

    app.add_hooks(Capture())

    @app.task(name="secret")
    def secret(password: str) -> None: ...

    secret.apply_async(("hunter2",), argsrepr="(<hidden>,)", kwargsrepr="{}")
    secret.s("x").set(argsrepr="A", kwargsrepr="K").delay()
    app.send_task("secret", ("y",), argsrepr="B")
    secret.delay("z")
    reprs = [(m.headers["argsrepr"], m.headers["kwargsrepr"]) for m in sent]
    assert reprs == [("(<hidden>,)", "{}"), ("A", "K"), ("B", "{}"), ("('z',)", "{}")]


def test_ignore_result_call_option_returns_none_at_once(app: Celeriac) -> None:
    @app.task(name="add2")
    def add(x: int, y: int) -> int:
        return x + y

    result = add.apply_async((1, 2), ignore_result=True)
    assert result.ignored is True
    assert result.get(timeout=0) is None  # no worker: nothing to wait for
    assert add.delay(1, 2).ignored is False


def test_retry_keeps_headers_and_takes_expires(app: Celeriac) -> None:
    @app.task(name="retry_once", bind=True, max_retries=1)
    def retry_once(self: Any) -> Any:
        if self.request.retries:
            return {"headers": {k: v for k, v in self.request.headers.items()
                                if k.startswith("x-")},
                    "expires": self.request.expires}
        raise self.retry(countdown=0, expires=60)

    with ThreadedWorker(app):
        got = retry_once.apply_async(headers={"x-test-header": "v"}).get(timeout=5)
    assert got["headers"] == {"x-test-header": "v"}
    assert got["expires"] is not None


def test_the_request_shows_the_message_properties(app: Celeriac) -> None:
    @app.task(name="props", bind=True)
    def props(self: Any) -> Any:
        return {"app_id": self.request.properties.get("app_id"),
                "priority": self.request.delivery_info["priority"]}

    with ThreadedWorker(app):
        assert props.apply_async(app_id="1234", priority=7).get(timeout=5) == {
            "app_id": "1234", "priority": 7}


def test_retry_keeps_the_priority(app: Celeriac) -> None:
    @app.task(name="retry_prio", bind=True, max_retries=1)
    def retry_prio(self: Any) -> Any:
        if self.request.retries:
            return self.request.delivery_info["priority"]
        raise self.retry(countdown=0)

    with ThreadedWorker(app):
        assert retry_prio.apply_async(priority=7).get(timeout=5) == 7


@pytest.mark.parametrize("hard", [None, 5.0])
@pytest.mark.parametrize("properties", [None, {"priority": 7, "app_id": "a"}])
def test_a_jobs_properties_cross_the_pool_pipe(hard: float | None,
                                               properties: dict[str, Any] | None) -> None:
    from celeriac.worker.execute import Job
    from celeriac.worker.pool import pipes

    job = Job(3, {"id": "x", "task": "t"}, b"body", "application/json", "celery", 1, "h",
              properties)
    frame = pipes.encode_job(job, 1.0, hard)
    payload = frame[pipes.HEADER.size:]
    assert pipes.decode_job(payload) == (job, 1.0, hard)


def test_replace_in_nested_chords(app: Celeriac) -> None:
    """A chord body that replaces itself with a group: the replacement's body has the
    same id and a chord-body claim of its own (the replaced body's is taken)."""
    t = replacing_tasks(app)
    add = t["add"]

    @app.task(name="tsum")
    def tsum(nums: list[int]) -> int:
        return sum(nums)

    @app.task(name="add_to_all", bind=True)
    def add_to_all(self: Any, nums: list[int], val: int) -> Any:
        raise self.replace(group(*[add.s(n, val) for n in nums]))

    with ThreadedWorker(app):
        inner = chord([add.s(1, 2), t["rep"].s(3, 4)], add_to_all.s(5)) | tsum.s()
        assert inner.delay().get(timeout=5) == 20
        outer = chord([
            chord([add.s(1, 2), t["rep"].s(3, 4)], add_to_all.s(5)) | tsum.s(),
            chord([t["rep"].s(6, 7), add.s(0, 0)], add_to_all.s(8)) | tsum.s(),
        ], add_to_all.s(9))
        assert outer.delay().get(timeout=5) == [29, 38]


def test_add_to_chord(app: Celeriac) -> None:
    t = replacing_tasks(app)
    add, ident = t["add"], t["ident"]

    @app.task(name="tsum2")
    def tsum(nums: list[int]) -> int:
        return sum(nums)

    @app.task(name="adds", bind=True)
    def adds(self: Any, nums: list[int], val: int) -> int:
        for n in nums:
            self.add_to_chord(add.s(n, val))
        return 0

    @app.task(name="adds_chord", bind=True)
    def adds_chord(self: Any, nums: list[int], val: int) -> int:
        self.add_to_chord(group([add.s(n, val) for n in nums]) | tsum.s())
        return 0

    @app.task(name="alone", bind=True)
    def alone(self: Any) -> None:
        self.add_to_chord(add.s(1, 1))

    with ThreadedWorker(app):
        assert sorted((group([adds.s([1, 2, 3], 4)]) | ident.s())().get(timeout=5)) == [
            0, 5, 6, 7]
        assert sorted((group([adds_chord.s([1, 2, 3], 4)]) | ident.s())().get(
            timeout=5)) == [0, 18]
        assert chord([adds.s([1], 1), add.s(1, 1)], ident.s())().get(timeout=5) == [0, 2, 2]
        with pytest.raises(ValueError, match="not member of any chord"):
            alone.delay().get(timeout=5)
