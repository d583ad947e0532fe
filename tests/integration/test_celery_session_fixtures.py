"""Celery's session fixtures and test helpers under celeriac's name (issue 26), run as
Celery's own integration suite runs them: an inner pytest session whose conftest is
Celery's, renamed (``celery_session_worker`` with a prefork pool on a real Redis,
``Manager``, a per-test ``celery_app`` that sends to the session's worker)."""

from __future__ import annotations

import textwrap
import uuid

import pytest

from tests.services import require

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow  # a pytest subprocess and a prefork worker

INI = """
[pytest]
addopts = --strict-markers -p no:cacheprovider
pythonpath = .
"""

CONFTEST = """
import pytest

from celeriac.contrib.pytest import celery_app, celery_session_worker
from celeriac.contrib.testing.manager import Manager

__all__ = ("celery_app", "celery_session_worker")


@pytest.fixture(scope="session")
def celery_config():
    return {{"broker_url": "{url}", "result_backend": "{url}", "result_extended": True}}


@pytest.fixture(scope="session")
def celery_worker_pool():
    return "prefork"


@pytest.fixture(scope="session")
def celery_includes():
    return {{"proj_tasks"}}


@pytest.fixture(scope="session")
def celery_class_tasks():
    from proj_tasks import ClassBased
    return [ClassBased]


@pytest.fixture
def app(celery_app):
    yield celery_app


@pytest.fixture
def manager(app, celery_session_worker):
    manager = Manager(app)
    yield manager
    manager.wait_until_idle()


@pytest.fixture(autouse=True)
def ZZZZ_set_app_current(app):
    app.set_current()
    app.set_default()
"""

TASKS = """
import os

from celeriac import Task, shared_task
from celeriac.utils.log import get_task_logger

logger = get_task_logger(__name__)


@shared_task
def add(x, y):
    logger.info("adding %s and %s", x, y)
    return x + y


@shared_task
def pid():
    return os.getpid()


class ClassBased(Task):
    name = "class_based"

    def run(self, x):
        return ("class", x, self.name)
"""

TESTS = """
import os

from celeriac.exceptions import TimeoutError
from celeriac.result import ResultSet
from celeriac.utils.nodenames import anon_nodename

from proj_tasks import add, pid


def test_a_task_runs_on_the_session_worker(manager):
    assert add.delay(2, 3).get(timeout=10) == 5
    assert pid.delay().get(timeout=10) != os.getpid()  # a forked pool child ran it


def test_the_worker_is_named_as_celerys(manager):
    assert list(manager.inspect().ping()) == [anon_nodename()]


def test_result_set_and_join(manager):
    rs = ResultSet([add.delay(1, 1), add.delay(2, 2)])
    assert rs.get(timeout=10) == [2, 4]
    assert manager.join(add.delay(3, 3), timeout=10) == [6]


def test_class_based_task(manager, celery_session_app):
    assert "class_based" in celery_session_app.tasks
    result = manager.app.send_task("class_based", [7])
    assert result.get(timeout=10) == ["class", 7, "class_based"]


def test_timeout_is_celerys_name(manager):
    try:
        manager.app.AsyncResult("never-sent").get(timeout=0.05)
    except TimeoutError:
        return
    raise AssertionError("no TimeoutError")


def test_session_app_is_one_app(celery_session_app, celery_app):
    assert celery_session_app is not celery_app
    assert celery_session_app.conf.broker_url == celery_app.conf.broker_url
"""


def test_celerys_conftest_renamed_runs_its_session_worker(pytester: pytest.Pytester) -> None:
    url = f"{require('redis')}?namespace=cs{uuid.uuid4().hex[:10]}"
    pytester.makeini(INI)
    pytester.makeconftest(CONFTEST.format(url=url))
    pytester.makepyfile(proj_tasks=textwrap.dedent(TASKS), test_session=textwrap.dedent(TESTS))
    result = pytester.runpytest_subprocess("-v", timeout=120)
    result.assert_outcomes(passed=6)
