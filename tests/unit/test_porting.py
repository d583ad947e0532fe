"""Celery's app and task surface: shared_task, autodiscovery, base classes and their
handlers, apply_async's options, extended results, what a worker refuses to half-run."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from celeriac import (
    BrokerUnavailable,
    Celeriac,
    ConfigurationError,
    DecodeError,
    Task,
    current_app,
    serialization,
    shared_task,
    states,
)
from celeriac.protocol import Message, task_headers, task_properties
from celeriac.tasks import Request
from celeriac.testing import ThreadedWorker


def memory_app(**settings: Any) -> Celeriac:
    return Celeriac(f"p{uuid.uuid4().hex[:6]}", broker=f"memory://{uuid.uuid4().hex}",
                    **settings)


def test_shared_task_binds_to_apps_made_before_and_after_and_follows_the_current() -> None:
    before = memory_app(task_always_eager=True)

    @shared_task(name="lib.double")
    def double(x: int) -> int:
        return 2 * x

    after = memory_app(task_always_eager=True)
    assert "lib.double" in before.tasks and "lib.double" in after.tasks
    assert current_app.main == after.main
    assert double.delay(21).get() == 42 and double.app is after
    before.set_current()
    assert double.app is before and double(5) == 10
    before.close()
    after.close()


def test_autodiscover_and_include_import_at_finalize(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / f"disc{uuid.uuid4().hex[:6]}"
    (pkg / "orders").mkdir(parents=True)
    (pkg / "empty").mkdir()
    for d in (pkg, pkg / "orders", pkg / "empty"):
        (d / "__init__.py").write_text("")
    (pkg / "orders" / "tasks.py").write_text(
        "from celeriac import shared_task\n@shared_task\ndef ship(n):\n    return n\n")
    (pkg / "extra.py").write_text(
        "from celeriac import shared_task\n@shared_task\ndef extra():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    app = memory_app(include=[f"{pkg.name}.extra"])
    app.autodiscover_tasks([f"{pkg.name}.orders", f"{pkg.name}.empty"])
    assert f"{pkg.name}.orders.tasks.ship" not in app.tasks  # lazy, as Celery's
    app.finalize()
    assert {f"{pkg.name}.orders.tasks.ship", f"{pkg.name}.extra.extra"} <= set(app.tasks)
    (pkg / "broken").mkdir()
    (pkg / "broken" / "__init__.py").write_text("")
    (pkg / "broken" / "tasks.py").write_text("import no_such_module_here\n")
    with pytest.raises(ModuleNotFoundError, match="no_such_module_here"):
        app.autodiscover_tasks([f"{pkg.name}.broken"], force=True)
    app.close()
    for name in [m for m in sys.modules if m.startswith(pkg.name)]:
        del sys.modules[name]


class Recorded(Task[Any, Any]):
    max_retries = 5
    acks_late = False
    calls: list[tuple[str, Any]] = []

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        self.calls.append(("before_start", args))

    def on_success(self, retval: Any, task_id: str, args: Any, kwargs: Any) -> None:
        self.calls.append(("on_success", retval))

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any,
                   einfo: Any) -> None:
        self.calls.append(("on_failure", (type(exc).__name__, "Traceback" in str(einfo))))

    def after_return(self, status: str, retval: Any, task_id: str, args: Any, kwargs: Any,
                     einfo: Any) -> None:
        self.calls.append(("after_return", status))


def test_a_base_class_gives_defaults_and_its_handlers_run() -> None:
    app = memory_app(task_always_eager=True)

    @app.task(base=Recorded)
    def div(a: int, b: int) -> float:
        return a / b

    assert isinstance(div, Recorded) and div.max_retries == 5 and div.acks_late is False
    Recorded.calls.clear()
    assert div.delay(6, 3).get() == 2
    assert Recorded.calls == [("before_start", [6, 3]), ("on_success", 2.0),
                              ("after_return", states.SUCCESS)]
    Recorded.calls.clear()
    assert isinstance(div.delay(1, 0).get(propagate=False), ZeroDivisionError)
    assert Recorded.calls[1:] == [("on_failure", ("ZeroDivisionError", True)),
                                  ("after_return", states.FAILURE)]
    with pytest.raises(TypeError, match=r"base=.* must be a subclass of celeriac.Task"):
        app.task(base=dict)(lambda: None)
    app.close()


def test_max_retries_none_never_stops_retrying_as_in_celery() -> None:
    app = memory_app(task_always_eager=True)

    @app.task(bind=True, max_retries=None, default_retry_delay=0)
    def patient(self: Any, until: int) -> int:
        if self.request.retries < until:
            raise self.retry()
        return self.request.retries

    @app.task
    def plain() -> None: ...

    class Unlimited(Task[Any, Any]):
        max_retries = None

    @app.task(base=Unlimited)
    def inherited() -> None: ...

    assert patient.max_retries is None and inherited.max_retries is None
    assert plain.max_retries == app.settings.task_max_retries == 3  # unset: the default
    assert patient.apply((10,)).get() == 10  # past the default of 3
    app.close()


def test_app_task_class_and_annotations_apply_to_every_task() -> None:
    app = memory_app(task_cls=Recorded,
                     task_annotations={"*": {"max_retries": 9}, "x.slow": {"rate_limit": "5/m"}})

    @app.task(name="x.slow")
    def slow() -> None: ...

    app.finalize()
    assert isinstance(slow, Recorded) and slow.max_retries == 9
    assert slow.options.rate_limit == "5/m"
    app.close()


def test_eager_propagates() -> None:
    app = memory_app(task_always_eager=True, task_eager_propagates=True)

    @app.task
    def boom() -> None:
        raise KeyError("k")

    with pytest.raises(KeyError):
        boom.delay()
    app.close()


def fetch_one(app: Celeriac, queue: str) -> Message:
    import asyncio

    async def take() -> Message:
        t = app.transport
        await t.connect("probe")
        [d] = await t.fetch([queue], 1, 1.0)
        await t.ack([d])
        return d.message

    return asyncio.run(take())


def test_apply_async_takes_celerys_options_or_names_the_one_it_cannot() -> None:
    app = memory_app()

    @app.task
    def job(x: int) -> int:
        return x

    job.apply_async((1,), routing_key="reports", shadow="job[report]", time_limit=30,
                    soft_time_limit=20, headers={"tenant": "t1"})
    m = fetch_one(app, "reports")
    assert (m.headers["shadow"], m.headers["timelimit"], m.headers["tenant"]) == (
        "job[report]", [30, 20], "t1")
    with pytest.raises(TypeError, match=r"unknown option.*: frobnicate"):
        job.apply_async((1,), frobnicate=True)
    job.apply_async((1,), compression="zlib")
    assert fetch_one(app, "celery").headers["compression"] == "application/x-gzip"
    job.apply_async((1,), link=job.s(2), link_error=[job.si(3)])
    linked = fetch_one(app, "celery")
    _, _, embed = serialization.loads(linked.body, linked.content_type,
                                      frozenset({linked.content_type}))
    assert [(s["task"], s["args"]) for s in embed["callbacks"]] == [(job.name, [2])]
    assert [(s["task"], s["immutable"]) for s in embed["errbacks"]] == [(job.name, True)]
    with pytest.raises(ConfigurationError, match="exchange='other' is not supported"):
        job.apply_async((1,), exchange="other")
    app.close()


def test_a_task_sent_from_a_task_carries_its_parent_and_root() -> None:
    app = memory_app()

    @app.task
    def child() -> None: ...

    outer = Request(id="outer-1", task="parent", root_id="root-1", called_directly=False)
    child_task = app.tasks[child.name]

    def send() -> None:
        child_task.delay()

    parent_task = app.task(name="parent")(send)
    parent_task.run_with(outer, (), {})
    m = fetch_one(app, "celery")
    assert (m.headers["parent_id"], m.headers["root_id"]) == ("outer-1", "root-1")
    app.close()


def test_retry_false_fails_at_once_on_an_unreachable_broker() -> None:
    app = Celeriac("down", broker="redis://127.0.0.1:1/0", broker_connection_max_retries=50)
    with pytest.raises(BrokerUnavailable):
        app.send_task("t", retry=False)
    with pytest.raises(BrokerUnavailable):
        app.send_task("t", retry_policy={"max_retries": 0})
    app.close()


def test_extended_results_and_what_a_worker_will_not_half_run() -> None:
    app = memory_app(result_extended=True)

    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    with ThreadedWorker(app):
        r = add.delay(2, 3)
        assert r.wait(timeout=10) == 5
        plain = app.AsyncResult(r.id)
        assert (plain.name, plain.args, plain.kwargs, plain.queue) == (add.name, [2, 3], {},
                                                                        "celery")
        assert plain.worker and plain.date_done is not None and plain.retries == 0
        # A chord header without its size: counting it could never complete the chord.
        _, body = serialization.dumps([[1, 2], {}, {"chord": {"task": "next"}}])
        headers = task_headers(task=add.name, task_id="chained", args_repr="", kwargs_repr="")
        app.transport.publish("celery", Message(headers, body, "application/json", "utf-8",
                                                task_properties("chained", 0)))
        with pytest.raises(DecodeError, match=r"chord_size must be a positive int"):
            app.AsyncResult("chained").get(timeout=10)
    app.close()
