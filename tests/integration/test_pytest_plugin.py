"""The pytest plugin (``celeriac.contrib.pytest``), run as its users run it: inner pytest
sessions in subprocesses, found through the installed ``pytest11`` entry point."""

from __future__ import annotations

import textwrap

import pytest

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow  # each test starts a pytest subprocess

# What the outer suite insists on, so that the inner sessions must pass as cleanly.
INI = """
[pytest]
addopts = --strict-markers -p no:cacheprovider
filterwarnings = error
pythonpath = .
"""


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makeini(INI)
    return pytester.runpytest_subprocess("-v", *args, timeout=90)


def test_celery_names_run_a_task_on_a_real_worker(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_celery_names=textwrap.dedent("""
        from celeriac import Celeriac
        from celeriac.testing import ThreadedWorker

        def test_add(celery_app, celery_worker):
            # Defined after the worker started: the worker looks tasks up as they arrive.
            @celery_app.task
            def add(x, y):
                return x + y

            assert add.delay(2, 2).get(timeout=10) == 4
            assert isinstance(celery_app, Celeriac)
            assert isinstance(celery_worker, ThreadedWorker)
            assert celery_worker.worker.app is celery_app
            assert celery_worker.worker.pool_name == "solo"

        def test_bare_memory_url_is_private_to_the_test(celery_app):
            url = celery_app.conf.broker_url
            assert url.startswith("memory://pytest-"), url
            assert celery_app.conf.backend_url == url

        def test_left_behind_a_message(celery_app):
            celery_app.send_task("nobody.runs.this")
            assert celery_app.transport.queue_length("celery") == 1

        def test_does_not_see_it(celery_app, celery_worker):
            assert celery_app.transport.queue_length("celery") == 0

        def test_aliases_are_the_same_objects(celery_app, celeriac_app, celery_worker,
                                              celeriac_worker):
            assert celery_app is celeriac_app
            assert celery_worker is celeriac_worker
    """))
    result = run(pytester)
    result.assert_outcomes(passed=5)


def test_conftest_overriding_celery_config_gets_the_sqlite_broker(
        pytester: pytest.Pytester) -> None:
    pytester.makeconftest(textwrap.dedent("""
        import pytest

        @pytest.fixture(scope="session")
        def celery_config(tmp_path_factory):
            db = tmp_path_factory.mktemp("broker") / "celeriac.db"
            return {"broker_url": f"sqlite:///{db}", "task_track_started": True}
    """))
    pytester.makepyfile(test_sqlite=textwrap.dedent("""
        import os

        from celeriac import states

        def test_add_on_sqlite(celery_app, celery_worker, celeriac_config):
            @celery_app.task
            def add(x, y):
                return x + y

            r = add.delay(2, 2)
            assert r.get(timeout=10) == 4
            assert r.state == states.SUCCESS
            url = celery_app.conf.broker_url
            assert url.startswith("sqlite:///") and url.endswith("celeriac.db"), url
            assert os.path.exists(url.removeprefix("sqlite:///"))
            assert celery_app.conf.task_track_started is True
            # celeriac_config is what the app was built from: the override, over defaults.
            assert celeriac_config["broker_url"] == url
    """))
    result = run(pytester)
    result.assert_outcomes(passed=1)


def test_markers_override_settings_closest_wins(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_markers=textwrap.dedent("""
        import pytest

        pytestmark = pytest.mark.celeriac(task_default_priority=3)

        @pytest.mark.celery(task_default_queue="other")
        def test_worker_follows_the_marked_queue(celery_app, celery_worker):
            @celery_app.task
            def add(x, y):
                return x + y

            assert celery_worker.worker.queues == ["other"]
            assert add.delay(2, 2).get(timeout=10) == 4
            assert celery_app.conf.task_default_priority == 3  # the module's marker too

        @pytest.mark.celeriac(task_always_eager=True)
        def test_eager_without_a_worker(celeriac_app):
            @celeriac_app.task
            def mul(x, y):
                return x * y

            assert mul.delay(3, 4).get(timeout=1) == 12

        @pytest.mark.celeriac(task_default_priority=7)
        class TestClass:
            @pytest.mark.celery(task_default_priority=9)
            def test_function_marker_beats_class_and_module(self, celery_app):
                assert celery_app.conf.task_default_priority == 9

            def test_class_marker_beats_module(self, celery_app):
                assert celery_app.conf.task_default_priority == 7

        def test_unmarked_settings_are_untouched(celery_app, celery_config):
            assert celery_config == {}
            assert celery_app.conf.task_default_queue == "celery"

        @pytest.mark.celery("positional")
        def test_positional_marker_argument_is_an_error(celery_app):
            pass

        @pytest.mark.celery(no_such_setting=1)
        def test_unknown_setting_is_an_error(celery_app):
            pass
    """))
    result = run(pytester)
    result.assert_outcomes(passed=5, errors=2)
    result.stdout.fnmatch_lines([
        "*@pytest.mark.celery takes settings as keywords only*",
        "*unknown setting *no_such_setting*",
    ])


def test_celeriac_names_and_includes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(projtasks=textwrap.dedent("""
        from celeriac import Celeriac

        app = Celeriac("proj", broker="memory://proj")

        @app.task(bind=True)
        def whoami(self):
            return self.request.hostname
    """))
    pytester.makeconftest(textwrap.dedent("""
        import pytest

        @pytest.fixture(scope="session")
        def celeriac_config():
            return {"broker_url": "memory://", "task_default_queue": "mine"}

        @pytest.fixture(scope="session")
        def celeriac_parameters():
            return {"main": "myproj"}

        @pytest.fixture(scope="session")
        def celeriac_includes():
            return ["projtasks"]

        @pytest.fixture(scope="session")
        def celeriac_worker_parameters():
            return {"hostname": "tester@here"}
    """))
    pytester.makepyfile(test_celeriac_names=textwrap.dedent("""
        import projtasks

        def test_included_task_runs_on_the_test_worker(celeriac_app, celeriac_worker):
            assert celeriac_app.main == "myproj"
            assert celeriac_worker.worker.queues == ["mine"]
            task = celeriac_app.tasks["projtasks.whoami"]
            assert task is not projtasks.whoami and task.app is celeriac_app
            assert task.delay().get(timeout=10) == "tester@here"
            assert projtasks.whoami.app is projtasks.app  # the module's task is untouched
    """))
    result = run(pytester)
    result.assert_outcomes(passed=1)


def test_celery_worker_parameters_and_pool_overrides(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(textwrap.dedent("""
        import pytest

        @pytest.fixture(scope="session")
        def celery_parameters():
            return {"main": "legacy"}

        @pytest.fixture(scope="session")
        def celery_worker_parameters():
            return {"queues": ["a", "b"], "heartbeat": False}

        @pytest.fixture(scope="session")
        def celery_worker_pool():
            return "no-such-pool"
    """))
    pytester.makepyfile(test_params=textwrap.dedent("""
        import pytest

        def test_app_parameters(celeriac_app, celeriac_worker_parameters):
            assert celeriac_app.main == "legacy"
            assert celeriac_worker_parameters == {"queues": ["a", "b"], "heartbeat": False}

        def test_pool_reaches_the_worker(celery_worker):
            pass
    """))
    result = run(pytester)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*pool must be one of*no-such-pool*"])


def test_conftest_overriding_celery_app_reaches_the_worker(pytester: pytest.Pytester
                                                         ) -> None:
    pytester.makeconftest(textwrap.dedent("""
        import pytest
        from celeriac import Celeriac

        @pytest.fixture
        def celery_app():
            app = Celeriac("mine", broker="memory://conftest-app")
            yield app
            app.close()
    """))
    pytester.makepyfile(test_own_app=textwrap.dedent("""
        def test_worker_uses_the_overridden_app(celery_app, celeriac_worker):
            assert celeriac_worker.worker.app is celery_app
            assert celery_app.main == "mine"

            @celery_app.task
            def add(x, y):
                return x + y

            assert add.delay(1, 2).get(timeout=10) == 3
    """))
    result = run(pytester)
    result.assert_outcomes(passed=1)
