"""Celery's import paths under celeriac's name (issue 26): after the rename ``celery`` ->
``celeriac`` a project's imports resolve, each to celeriac's own class (one class per
concept), and a name celeriac leaves out says why in its ImportError."""

from __future__ import annotations

import importlib
import io
import logging
import os
import pickle
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from celeriac import Celeriac, Task, errors, states
from celeriac.backends.base import BaseKeyValueStoreBackend, ResultBackend, create_backend
from celeriac.result import AsyncResult, GroupResult, ResultSet
from celeriac.settings import Settings
from celeriac.testing import ThreadedWorker, wait_until

# celery.exceptions.__all__ (5.5), after the rename (CeleryError -> CeleriacError...).
CELERY_EXCEPTIONS = {
    "CeleriacError": errors.CeleriacError,
    "ImproperlyConfigured": errors.ConfigurationError,
    "OperationalError": errors.OperationalError,
    "TaskPredicate": errors.TaskControl,
    "Ignore": errors.Ignore,
    "Reject": errors.Reject,
    "Retry": errors.Retry,
    "TaskError": errors.TaskError,
    "QueueNotFound": errors.ConfigurationError,
    "IncompleteStream": errors.IncompleteStream,
    "NotRegistered": errors.NotRegistered,
    "TimeoutError": errors.ResultTimeout,
    "MaxRetriesExceededError": errors.MaxRetriesExceededError,
    "TaskRevokedError": errors.TaskRevoked,
    "InvalidTaskError": errors.DecodeError,
    "ChordError": errors.ChordError,
    "SoftTimeLimitExceeded": errors.SoftTimeLimitExceeded,
    "TimeLimitExceeded": errors.TimeLimitExceeded,
    "WorkerLostError": errors.WorkerLostError,
    "WorkerShutdown": errors.WorkerShutdown,
    "WorkerTerminate": errors.WorkerTerminate,
}
CELERY_EXCEPTIONS_LEFT_OUT = [
    "CeleriacWarning", "AlwaysEagerIgnored", "DuplicateNodenameWarning", "FixupWarning",
    "NotConfigured", "SecurityWarning", "CPendingDeprecationWarning", "CDeprecationWarning",
    "AlreadyRegistered", "BackendError", "BackendGetMetaError",
    "BackendStoreError", "Terminated", "CeleriacCommandException",
]


def memory_app(**settings: Any) -> Celeriac:
    url = f"memory://{uuid.uuid4().hex}"
    return Celeriac(f"t{uuid.uuid4().hex[:6]}", broker=url, backend=url, **settings)


@pytest.fixture
def app() -> Iterator[Celeriac]:
    app = memory_app()
    yield app
    app.close()


# -- celeriac.exceptions -------------------------------------------------------------------
@pytest.mark.parametrize(("name", "ours"), sorted(CELERY_EXCEPTIONS.items()))
def test_exceptions_are_celeriacs_own_classes(name: str, ours: type[BaseException]) -> None:
    module = importlib.import_module("celeriac.exceptions")
    assert getattr(module, name) is ours


def test_an_except_with_celerys_name_catches_what_celeriac_raises(app: Celeriac) -> None:
    from celeriac.exceptions import TimeoutError as CeleryTimeoutError

    with pytest.raises(CeleryTimeoutError):
        app.AsyncResult(uuid.uuid4().hex).get(timeout=0.01)


@pytest.mark.parametrize("name", CELERY_EXCEPTIONS_LEFT_OUT)
def test_exceptions_left_out_say_why(name: str) -> None:
    with pytest.raises(ImportError, match=rf"celeriac\.exceptions\.{name} .*not provided: "):
        exec(f"from celeriac.exceptions import {name}", {})


def test_exceptions_unknown_name_is_a_plain_import_error() -> None:
    with pytest.raises(ImportError, match="cannot import name 'NoSuchThing'"):
        exec("from celeriac.exceptions import NoSuchThing", {})


def test_exceptions_all_is_importable_and_reraise_keeps_the_traceback() -> None:
    import celeriac.exceptions as exc_module

    for name in exc_module.__all__:
        assert getattr(exc_module, name) is not None
    try:
        raise ValueError("x")
    except ValueError as caught:
        tb = caught.__traceback__
        with pytest.raises(ValueError) as info:
            exc_module.reraise(ValueError, caught, tb)
    assert info.value.__traceback__ is not None


# -- celeriac.utils.log ---------------------------------------------------------------------
def test_get_task_logger_is_the_named_logger_and_refuses_celeriacs_names() -> None:
    from celeriac.utils.log import get_logger, get_task_logger

    logger = get_task_logger("proj.tasks")
    assert logger is logging.getLogger("proj.tasks") is get_logger("proj.tasks")
    assert get_task_logger("proj.tasks").filters.count(logger.filters[0]) == 1
    for reserved in ("celeriac", "celeriac.task"):
        with pytest.raises(RuntimeError, match="reserved"):
            get_task_logger(reserved)


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_task_logger_records_carry_the_running_tasks_id_and_name(app: Celeriac) -> None:
    from celeriac.utils.log import get_task_logger

    name = f"proj.tasks{uuid.uuid4().hex[:6]}"
    logger = get_task_logger(name)
    handler = Records()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    @app.task(name="proj.logs")
    def logs() -> None:
        logger.info("inside")

    try:
        logger.info("outside")
        with ThreadedWorker(app):
            result = logs.delay()
            result.get(timeout=10)
    finally:
        logger.removeHandler(handler)
    outside, inside = handler.records
    assert (outside.task_id, outside.task_name) == ("???", "???")  # type: ignore[attr-defined]
    assert inside.task_id == result.id  # type: ignore[attr-defined]
    assert inside.task_name == "proj.logs"  # type: ignore[attr-defined]


# -- celeriac.utils.nodenames ---------------------------------------------------------------
def test_nodenames_are_the_command_lines_and_anon_nodename_is_celerys() -> None:
    from celeriac.utils import nodenames

    # The command line's -n/--logfile/--pidfile expansion is this module's.
    cli_worker = importlib.import_module("celeriac.cli.worker")
    for name in ("node_format", "worker_hostname"):
        assert getattr(nodenames, name) is getattr(cli_worker, name)
    assert nodenames.anon_nodename() == f"gen{os.getpid()}@{socket.gethostname()}"
    assert nodenames.anon_nodename("box", prefix="w") == f"w{os.getpid()}@box"
    assert nodenames.nodesplit(nodenames.anon_nodename("box")) == (f"gen{os.getpid()}", "box")
    with pytest.raises(ImportError, match="no per-worker queues"):
        exec("from celeriac.utils.nodenames import worker_direct", {})


# -- celeriac.utils.serialization -----------------------------------------------------------
class Unrecreatable(Exception):
    """Its constructor needs two arguments; its args hold one (Celery's example)."""

    def __init__(self, foo: str, bar: str | None = None) -> None:
        if bar is None:
            raise TypeError("bar must be provided")
        super().__init__(foo)


def test_unpickleable_exception_wrapper_is_task_failed_with_celerys_attributes(
        app: Celeriac) -> None:
    from celeriac.utils.serialization import UnpickleableExceptionWrapper

    assert UnpickleableExceptionWrapper is errors.TaskFailed

    @app.task(name="proj.fails")
    def fails(foo: str, bar: str) -> None:
        raise Unrecreatable(foo, bar)

    with ThreadedWorker(app):
        result = fails.delay("foo", "bar")
        with pytest.raises(UnpickleableExceptionWrapper) as info:
            result.get(timeout=10)
    wrapper = info.value
    assert wrapper.exc_cls_name == "Unrecreatable"
    assert wrapper.exc_module == __name__
    assert wrapper.exc_args == ("foo",)
    assert wrapper.text == "foo"
    assert result.status == states.FAILURE
    copy = pickle.loads(pickle.dumps(wrapper))
    assert (copy.exc_type, copy.exc_args, str(copy)) == (wrapper.exc_type, ("foo",),
                                                         str(wrapper))
    with pytest.raises(ImportError, match="never pickles"):
        exec("from celeriac.utils.serialization import get_pickled_exception", {})


# -- celeriac.result -------------------------------------------------------------------------
def test_async_result_task_id_and_current_app(app: Celeriac) -> None:
    app.set_current()
    result = AsyncResult("abc")
    assert result.app is app and result.task_id == result.id == "abc"


def test_ignored_result_get_returns_none_at_once_without_a_worker(app: Celeriac) -> None:
    @app.task(name="proj.quiet", ignore_result=True)
    def quiet() -> int:
        return 1

    @app.task(name="proj.loud")
    def loud() -> int:
        return 1

    result = quiet.delay()
    assert result.ignored is True
    started = time.monotonic()
    assert result.get(timeout=30) is None
    assert time.monotonic() - started < 5
    assert loud.delay().ignored is False
    other = loud.delay()
    other.ignored = True  # what a call's own ignore_result=True sets
    assert other.get(timeout=30) is None


def test_result_set_waits_on_its_results_and_is_a_set(app: Celeriac) -> None:
    @app.task(name="proj.add")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="proj.boom")
    def boom() -> None:
        raise ValueError("boom")

    with ThreadedWorker(app):
        one, two = add.delay(1, 1), add.delay(2, 2)
        rs = ResultSet([one, two])
        assert rs.get(timeout=10) == [2, 4] and rs.join(timeout=10) == [2, 4]
        assert rs.app is app and len(rs) == 2 and list(rs) == [one, two]
        assert rs.ready() and rs.successful() and rs.completed_count() == 2

        failing = ResultSet([boom.delay(), add.delay(1, 1)])
        values = failing.get(timeout=10, propagate=False)
        assert isinstance(values[0], ValueError) and values[1] == 2
        assert failing.results[0].failed() and failing.results[1].successful()
        assert failing.failed()
        with pytest.raises(ValueError, match="boom"):
            failing.get(timeout=10)

    rs.add(one)
    assert len(rs) == 2
    rs.update([one, AsyncResult("x", app)])
    assert [r.id for r in rs] == [one.id, two.id, "x"]
    rs.remove("x")
    rs.discard("x")
    with pytest.raises(KeyError):
        rs.remove("x")
    assert rs == ResultSet([one, two])
    rs.clear()
    assert len(rs) == 0
    with pytest.raises(errors.ResultTimeout, match="result set: 1 of 1"):
        ResultSet([AsyncResult(uuid.uuid4().hex, app)]).get(timeout=0.01)


def test_group_result_is_a_result_set_with_an_id(app: Celeriac) -> None:
    members = [AsyncResult("a", app), AsyncResult("b", app)]
    group = GroupResult("g", members, app)
    assert isinstance(group, ResultSet) and group.results == members
    assert group != ResultSet(members) and group == GroupResult("g", members, app)
    assert hash(group) == hash("g")
    with pytest.raises(errors.ResultTimeout, match="group g: 2 of 2"):
        group.get(timeout=0.01)


# -- backends ---------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["memory", "sqlite"])
def test_every_backend_allows_chords(scheme: str, tmp_path: Any) -> None:
    url = (f"memory://{uuid.uuid4().hex}" if scheme == "memory"
           else f"sqlite:///{tmp_path}/r.db")
    backend = create_backend(url, Settings())
    try:
        assert backend.ensure_chords_allowed() is None
        assert isinstance(backend, BaseKeyValueStoreBackend)
    finally:
        backend.close()
    assert BaseKeyValueStoreBackend is ResultBackend


# -- the app: set_default, register_task, autodiscover ------------------------------------------
def test_set_default_makes_the_app_current(app: Celeriac) -> None:
    from celeriac import current_app

    other = memory_app()
    try:
        assert current_app.main == other.main
        app.set_default()
        assert current_app.main == app.main
    finally:
        other.close()


class ClassBasedRetry(Task[Any, Any]):
    """Celery's class-based task: options as class attributes, the body in ``run``."""

    name = "proj.class_based"
    autoretry_for = (ValueError,)
    max_retries = 1
    default_retry_delay = 0

    def run(self) -> int:
        if self.request.retries:
            return self.request.retries
        raise ValueError()


def test_register_task_of_a_class_based_task_runs_it_bound(app: Celeriac) -> None:
    task = app.register_task(ClassBasedRetry)
    assert isinstance(task, ClassBasedRetry) and app.tasks["proj.class_based"] is task
    with ThreadedWorker(app):
        assert task.delay().get(timeout=10) == 1
    other = memory_app()
    try:
        copy = other.register_task(task)
        assert copy is other.tasks["proj.class_based"] and copy.app is other
        assert type(copy) is ClassBasedRetry
    finally:
        other.close()
    with pytest.raises(TypeError, match="run\\(\\) method"):
        app.register_task(Task)  # type: ignore[type-abstract]


def test_autodiscover_skips_a_module_that_is_not_a_package_as_celery_does(
        app: Celeriac) -> None:
    app.autodiscover_tasks(["datetime.datetime"], "no_such_tasks", force=True)
    with pytest.raises(ModuleNotFoundError):
        app.autodiscover_tasks(["nonexistent_pkg.sub.name"], "tasks", force=True)


# -- celeriac.contrib.testing -----------------------------------------------------------------
def test_start_worker_pings_and_the_manager_waits(app: Celeriac) -> None:
    from celeriac.contrib.testing.manager import Manager, Sentinel
    from celeriac.contrib.testing.worker import start_worker
    from celeriac.utils.nodenames import anon_nodename

    @app.task(name="proj.mul")
    def mul(x: int, y: int) -> int:
        return x * y

    assert "celery.ping" in app.tasks
    with start_worker(app, perform_ping_check=True) as worker:
        assert worker.worker.hostname == anon_nodename()
        manager = Manager(app)
        assert manager.join(mul.delay(6, 7), timeout=10) == [42]
        assert manager.join(ResultSet([mul.delay(2, 3)], app), timeout=10) == [6]
        calls = iter([False, False, True])
        assert manager.wait_for(lambda: manager.true_or_raise(lambda: next(calls)),
                                (Sentinel,), interval_start=0.01, interval_step=0.0) is True
        manager.ensure_not_for_a_while(lambda: manager.true_or_raise(lambda: False),
                                       (Sentinel,), max_retries=2, interval_start=0.01)
        manager.wait_until_idle()
    assert worker.exit_code == 0


def test_manager_join_gives_up_after_its_retries(app: Celeriac) -> None:
    from celeriac.contrib.testing.manager import Manager

    out = io.StringIO()
    with pytest.raises(AssertionError, match="Missing task results"):
        Manager(app, stdout=out).join(AsyncResult("lost", app), timeout=0.01, max_retries=2)
    assert out.getvalue().count("!Still waiting for 1/1: [lost]") == 2


# -- celeriac.contrib.abortable -----------------------------------------------------------------
def test_abortable_task_stops_when_asked(app: Celeriac) -> None:
    from celeriac.contrib.abortable import ABORTED, AbortableAsyncResult, AbortableTask

    started = threading.Event()

    @app.task(name="proj.long", bind=True, base=AbortableTask)
    def long(self: AbortableTask[Any, Any]) -> str:
        started.set()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.is_aborted():
                return "aborted"
            time.sleep(0.01)  # sleep-ok: a task's work between two checks
        return "ran to the end"

    assert isinstance(long, AbortableTask)
    with ThreadedWorker(app):
        result = long.AsyncResult(long.delay().id)
        assert isinstance(result, AbortableAsyncResult)
        assert started.wait(10)
        assert not result.is_aborted()
        result.abort()
        assert result.is_aborted() and result.state == ABORTED
        assert result.get(timeout=10) == "aborted"
    result.abort()  # finished: the result stays
    assert result.state == states.SUCCESS
    wait_until(lambda: not result.is_aborted(), 1)
    with pytest.raises(ValueError, match="outside a running task"):
        long.is_aborted()
