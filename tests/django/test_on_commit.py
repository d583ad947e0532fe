"""``delay_on_commit`` / ``apply_async_on_commit`` (Celery 5.4's ``DjangoTask``) on a real
Django transaction (SQLite, this process's own database) and the memory broker: sent
after the commit, never on a rollback, at once outside a transaction; bad options refused
at the call; ``using=`` follows that database's transaction."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator

import pytest

from celeriac import Celeriac
from celeriac.contrib.django.task import DjangoTask
from celeriac.errors import ConfigurationError
from celeriac.tasks import Task
from tests.django import env


@pytest.fixture
def app() -> Iterator[Celeriac]:
    env.configure()
    url = f"memory://{uuid.uuid4().hex}"
    a = Celeriac("t", broker=url, backend=url)
    yield a
    a.close()


def queued(app: Celeriac) -> int:
    return app.transport.queue_length("celery")


def test_sent_after_the_commit_and_never_on_rollback(app: Celeriac) -> None:
    from django.db import transaction

    @app.task(name="t.add")
    def add(x: int, y: int) -> int:
        return x + y

    with transaction.atomic():
        assert add.delay_on_commit(1, 2) is None  # Celery's: no message yet, no handle
        add.apply_async_on_commit((3, 4), countdown=0, task_id="fixed-id")
        with transaction.atomic():  # a savepoint: still waits for the outermost commit
            add.delay_on_commit(5, 6)
        assert queued(app) == 0
    assert queued(app) == 3

    with pytest.raises(RuntimeError), transaction.atomic():
        add.delay_on_commit(7, 8)
        raise RuntimeError("rolled back")
    assert queued(app) == 3

    add.delay_on_commit(9, 10)  # no transaction: sent at once
    assert queued(app) == 4


def test_bad_options_are_refused_at_the_call(app: Celeriac) -> None:
    from django.db import transaction

    @app.task(name="t.noop")
    def noop() -> None:
        return None

    with transaction.atomic():
        with pytest.raises(TypeError, match=r"apply_async_on_commit\(\) got unknown option"):
            noop.apply_async_on_commit((), bogus=1)
        with pytest.raises(ValueError, match="using must be a database alias"):
            noop.apply_async_on_commit((), using="")
    assert queued(app) == 0


def test_using_follows_that_databases_transaction(app: Celeriac) -> None:
    from django.db import transaction

    @app.task(name="t.noop")
    def noop() -> None:
        return None

    with transaction.atomic(using=env.SQLITE_ALIAS):
        noop.apply_async_on_commit((), using=env.SQLITE_ALIAS)
        assert queued(app) == 0
    assert queued(app) == 1


def test_without_django_the_error_says_what_to_install(app: Celeriac,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    @app.task(name="t.noop")
    def noop() -> None:
        return None

    monkeypatch.setitem(sys.modules, "django.db", None)  # import django.db fails
    with pytest.raises(ConfigurationError, match=r"celeriac\[django\]"):
        noop.delay_on_commit()


def test_djangotask_is_at_celerys_path() -> None:
    assert DjangoTask is Task
