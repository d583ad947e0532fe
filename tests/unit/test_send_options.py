"""``SendOptions``: a send's options, made and checked once where the call comes in,
passed unchanged to ``build``; the body (with its embed) encoded once."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest

from celeriac import Celeriac, Hooks, serialization
from celeriac.producer import SendOptions, builder
from celeriac.protocol import Message
from celeriac.serialization import compression


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[SendOptions]:
    """The options every ``build`` call was given."""
    seen: list[SendOptions] = []
    real = builder.build

    def spy(app: Any, name: Any, args: Any, kwargs: Any, options: SendOptions,
            **kw: Any) -> Any:
        seen.append(options)
        return real(app, name, args, kwargs, options, **kw)

    monkeypatch.setattr(builder, "build", spy)
    return seen


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[SendOptions]:
    """Every ``SendOptions.check`` call."""
    seen: list[SendOptions] = []
    real = SendOptions.check

    def spy(self: SendOptions) -> SendOptions:
        seen.append(self)
        return real(self)

    monkeypatch.setattr(SendOptions, "check", spy)
    return seen


def test_frozen_with_slots() -> None:
    options = SendOptions(queue="q")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.queue = "other"  # type: ignore[misc]
    assert not hasattr(options, "__dict__")


def test_an_unknown_option_is_a_type_error_naming_it(memory_app: Celeriac) -> None:
    @memory_app.task(name="t")
    def t() -> None: ...

    with pytest.raises(TypeError, match="frobnicate"):
        t.apply_async(frobnicate=1)
    with pytest.raises(TypeError, match="'colour'"):
        memory_app.send_task("t", colour="red")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="'colour'"):
        t.s().apply_async(colour="red")
    assert memory_app.transport.queue_length("celery") == 0


@pytest.mark.parametrize(("option", "value", "error", "text"), [
    ("priority", 12, ValueError, "priority must be an int from 0 to 9, got 12"),
    ("countdown", "soon", TypeError, "countdown must be a number of seconds, got 'soon'"),
    ("expires", "later", TypeError, "expires must be seconds, a timedelta or a datetime"),
    ("eta", "tomorrow", TypeError, "eta must be a datetime, got 'tomorrow'"),
])
def test_a_bad_value_names_its_parameter(memory_app: Celeriac, option: str, value: Any,
                                         error: type[Exception], text: str) -> None:
    @memory_app.task(name="t")
    def t() -> None: ...

    for send in (lambda: t.apply_async(**{option: value}),
                 lambda: memory_app.send_task("t", **{option: value}),
                 lambda: t.s().set(**{option: value}).apply_async()):
        with pytest.raises(error, match=text):
            send()
    assert memory_app.transport.queue_length("celery") == 0


def test_built_once_and_passed_unchanged(memory_app: Celeriac, built: list[SendOptions],
                                         checks: list[SendOptions]) -> None:
    @memory_app.task(name="t", queue="tq", priority=3)
    def t(x: int) -> int:
        return x

    t.apply_async((1,), countdown=5, shadow="s")
    assert len(built) == 1 and checks == built  # checked once, that very object to build
    assert (built[0].countdown, built[0].shadow, built[0].queue, built[0].priority) == (
        5, "s", "tq", 3)
    memory_app.send_task("t", (2,), priority=4)
    assert len(built) == 2 and checks[1] is built[1]
    memory_app.send_many("t", [(3,), (4,), (5,)], priority=1)
    assert len(built) == 5 and checks[2] is built[2] is built[3] is built[4]


def test_delay_reuses_the_tasks_options(memory_app: Celeriac, built: list[SendOptions],
                                        checks: list[SendOptions]) -> None:
    @memory_app.task(name="t", queue="tq")
    def t(x: int) -> int:
        return x

    t.delay(1)
    t.delay(2)
    assert built[0] is built[1] and len(checks) == 1
    assert built[0].queue == "tq" and built[0].ignore_result is False
    t.options = dataclasses.replace(t.options, queue="other")  # as annotations do
    t.delay(3)
    assert built[2] is not built[0] and built[2].queue == "other" and len(checks) == 2
    assert memory_app.transport.queue_length("tq") == 2
    assert memory_app.transport.queue_length("other") == 1


def test_a_body_with_an_embed_is_encoded_once(memory_app: Celeriac,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    @memory_app.task(name="t")
    def t(x: int) -> int:
        return x

    calls: list[Any] = []
    real = serialization.dumps

    def spy(value: Any, *a: Any, **kw: Any) -> Any:
        calls.append(value)
        return real(value, *a, **kw)

    monkeypatch.setattr(serialization, "dumps", spy)
    sent: list[Message] = []

    class Capture(Hooks):
        def before_publish(self, message: Message, queue: str) -> None:
            sent.append(message)

    memory_app.add_hooks(Capture())
    t.apply_async((1,), link=t.s(), compression="gzip")
    assert len(calls) == 1
    (message,) = sent
    kind = message.headers[compression.HEADER]
    args, _, embed = orjson.loads(compression.decompress(message.body, kind, 10**6))
    assert args == [1] and embed["callbacks"][0]["task"] == "t"
    assert embed["errbacks"] is None and embed["chain"] is None


def test_a_soft_limit_over_the_hard_one_is_refused_at_call_time_as_celery_does() -> None:
    app = Celeriac("s", broker="memory://soft-over-hard")

    @app.task(soft_time_limit=10, time_limit=5)
    def wrong() -> None: ...

    @app.task
    def right() -> None: ...

    with pytest.raises(ValueError, match="soft_time_limit must be less than or equal to "
                                         "time_limit, got soft_time_limit=10"):
        wrong.delay()
    with pytest.raises(ValueError, match="soft_time_limit=3, time_limit=2"):
        right.apply_async(soft_time_limit=3, time_limit=2)
    assert app.transport.queue_length("celery") == 0
    right.apply_async(soft_time_limit=2, time_limit=2)
    assert app.transport.queue_length("celery") == 1
    app.close()
