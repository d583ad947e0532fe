"""``django-db`` beside django-celery-results itself (SQLite, this process's database):
what celeriac writes, its models and Celery's own ``DatabaseBackend`` read, and what
Celery writes, celeriac reads (existing rows keep working); connections of threads that
ended are closed. The backend's contract is ``tests/contracts`` (``django-*``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from celeriac import states
from celeriac.backends.base import ResultBackend, create_backend
from celeriac.settings import Settings
from tests.django import env


@pytest.fixture
def backend() -> Iterator[ResultBackend]:
    env.configure()
    env.create_tables(env.SQLITE_ALIAS, ("django_celery_results",))
    env.empty(env.SQLITE_ALIAS)
    b = create_backend("django-db", Settings(result_backend="django-db",
                                             result_extended=True))
    yield b
    b.close()


@pytest.fixture
def celery_backend() -> Iterator[Any]:
    """Celery's own django-celery-results backend, on the same tables."""
    from celery import Celery

    app = Celery("compat", broker="memory://",
                 backend="django_celery_results.backends:DatabaseBackend")
    yield app.backend
    app.close()


def test_what_celeriac_writes_django_celery_results_reads(backend: ResultBackend,
                                                          celery_backend: Any) -> None:
    from django_celery_results.models import TaskResult

    backend.store_many([backend.encode(
        "t-1", states.SUCCESS, {"total": 3}, retries=1,
        extended={"name": "shop.add", "args": [1, 2], "kwargs": {}, "worker": "w@h",
                  "queue": "celery"})])
    backend.store("t-2", states.FAILURE, ValueError("bad"), traceback="Traceback...")

    row = TaskResult.objects.get(task_id="t-1")
    assert (row.status, row.task_name, row.worker) == ("SUCCESS", "shop.add", "w@h")
    assert (row.content_type, row.content_encoding) == ("application/json", "utf-8")
    assert celery_backend.get_task_meta("t-1")["result"] == {"total": 3}
    failed = celery_backend.get_task_meta("t-2")
    assert failed["status"] == "FAILURE" and failed["traceback"] == "Traceback..."
    assert isinstance(celery_backend.exception_to_python(failed["result"]), ValueError)


def test_what_celery_wrote_celeriac_reads(backend: ResultBackend,
                                          celery_backend: Any) -> None:
    celery_backend.store_result("c-1", {"from": "celery"}, "SUCCESS")
    celery_backend.store_result("c-2", KeyError("k"), "FAILURE", traceback="tb")
    got = backend.get_many(["c-1", "c-2"])
    assert (got["c-1"].state, got["c-1"].result) == ("SUCCESS", {"from": "celery"})
    assert got["c-2"].state == "FAILURE"  # (Celery keeps its traceback only extended)
    assert got["c-2"].result["exc_type"] == "KeyError"


def test_connections_of_ended_threads_are_closed(backend: ResultBackend) -> None:
    def use() -> None:
        backend.get("nothing")

    for _ in range(5):
        t = threading.Thread(target=use)
        t.start()
        t.join()
    use()
    held = backend.db.count()  # type: ignore[attr-defined]
    assert held <= 2, "a connection per ended thread was kept open"
