"""The celeriac pytest plugin: an app and a real worker per test, as Celery's plugin gives.

Registered as the ``pytest11`` entry point ``celeriac``, so installing celeriac enables it
(``-p no:celeriac`` disables it). Fixtures:

- ``celeriac_app`` / ``celery_app``: a fresh app per test, closed afterwards.
- ``celeriac_worker`` / ``celery_worker``: a worker running in a thread of the test
  process (``celeriac.testing.ThreadedWorker``) on that app, started before the test and
  stopped after it.
- Session-scoped configuration, to override in a ``conftest.py`` under either name:
  ``celeriac_config`` / ``celery_config`` (settings), ``celeriac_parameters`` /
  ``celery_parameters`` (other ``Celeriac()`` keywords), ``celeriac_includes`` /
  ``celery_includes`` (modules whose tasks the app gets), ``celeriac_worker_pool`` /
  ``celery_worker_pool``, ``celeriac_worker_parameters`` / ``celery_worker_parameters``.
- Markers ``@pytest.mark.celeriac(**settings)`` and ``@pytest.mark.celery(**settings)``
  override settings for one test (or a class or module).
- Session-scoped, as Celery's: ``celeriac_session_app`` / ``celery_session_app`` (one app
  for the whole run, current and default), ``celeriac_session_worker`` /
  ``celery_session_worker`` (a worker on it for the whole run, started with
  ``celeriac.contrib.testing.worker.start_worker``: named ``gen<pid>@<host>``, a
  ``celery.ping`` check before the first test), ``celery_class_tasks`` (class-based
  tasks the session app registers, ``app.register_task``), and
  ``depends_on_current_app``. A test that uses the session worker sends through any app
  on the same broker (Celery's suites send through ``celery_app``): use a real broker
  for them, since a ``memory://`` broker is private to the app that made it.

Each pair is one chain, never two definitions of one thing: the ``celery_*`` config
fixture is the input and defaults to empty (as in Celery), the ``celeriac_*`` one is built
from it, and ``celeriac_app`` reads only the ``celeriac_*`` ones. Overriding either name
thus reaches the app; reading ``celeriac_config`` gives what the app uses. The app chain
runs the other way, ``celeriac_app`` -> ``celery_app`` -> ``celeriac_worker`` ->
``celery_worker``, so a conftest that replaces ``celery_app`` (a Celery habit) still gets
its app into the worker.
"""

from __future__ import annotations

import importlib
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

import pytest

# The plugin loads in every pytest run of an environment with celeriac installed; this
# module's package, ``celeriac``, imports all of these but ``testing`` (standard modules).
from celeriac.app import Celeriac
from celeriac.contrib.testing.worker import start_worker
from celeriac.settings import Settings
from celeriac.tasks import Task
from celeriac.testing import ThreadedWorker

DEFAULT_CONFIG: Mapping[str, Any] = {"broker_url": "memory://"}
"""The in-process broker; with no ``result_backend``, results go to the same place."""

DEFAULT_MAIN = "celeriac.tests"
MARKERS = ("celeriac", "celery")


def pytest_configure(config: pytest.Config) -> None:
    # Registered so that --strict-markers accepts them and --markers lists them.
    for name in MARKERS:
        config.addinivalue_line(
            "markers",
            f"{name}(**settings): override celeriac settings for this test's celeriac_app "
            "(and celery_app)",
        )


# -- configuration: Celery's names are the inputs, celeriac's the effective values ---------
@pytest.fixture(scope="session")
def celery_config() -> Mapping[str, Any]:
    """Settings for the test app, over ``celeriac_config``'s defaults. Override this or
    ``celeriac_config``."""
    return {}


@pytest.fixture(scope="session")
def celeriac_config(celery_config: Mapping[str, Any]) -> dict[str, Any]:
    """The settings the test app gets (before a marker's): ``broker_url="memory://"``
    unless ``celery_config`` says otherwise. A bare ``memory://`` is a broker of the
    test's own (see ``celeriac_app``)."""
    return {**DEFAULT_CONFIG, **celery_config}


@pytest.fixture(scope="session")
def celery_parameters() -> Mapping[str, Any]:
    """Other ``Celeriac()`` keywords (``main``, ``broker``, ``backend``, ``settings``).
    Override this or ``celeriac_parameters``."""
    return {}


@pytest.fixture(scope="session")
def celeriac_parameters(celery_parameters: Mapping[str, Any]) -> dict[str, Any]:
    """``Celeriac()`` keywords for the test app; ``main`` defaults to ``celeriac.tests``."""
    return {"main": DEFAULT_MAIN, **celery_parameters}


@pytest.fixture(scope="session")
def celery_includes() -> Sequence[str]:
    """Modules whose tasks the test app gets. Override this or ``celeriac_includes``."""
    return ()


@pytest.fixture(scope="session")
def celeriac_includes(celery_includes: Sequence[str]) -> tuple[str, ...]:
    """Modules imported for each test app; every task found at the top level of one is
    registered on the app too (a copy bound to it: send it through the app, e.g.
    ``celeriac_app.tasks[name].delay()``). Celeriac has no ``shared_task``, so this is how
    tasks defined on another app reach the test worker."""
    return tuple(celery_includes)


@pytest.fixture(scope="session")
def celery_worker_pool() -> str:
    """The test worker's pool (``solo``). Override this or ``celeriac_worker_pool``."""
    return "solo"


@pytest.fixture(scope="session")
def celeriac_worker_pool(celery_worker_pool: str) -> str:
    """The test worker's pool: ``solo`` runs tasks in the test process, where the test can
    see what they did. (``prefork`` would fork from the worker's thread.)"""
    return celery_worker_pool


@pytest.fixture(scope="session")
def celery_worker_parameters() -> Mapping[str, Any]:
    """``Worker`` keywords. Override this or ``celeriac_worker_parameters``."""
    return {}


@pytest.fixture(scope="session")
def celeriac_worker_parameters(celery_worker_parameters: Mapping[str, Any]) -> dict[str, Any]:
    """``Worker`` keywords for the test worker (``queues``, ``hostname``, ``concurrency``,
    ``task_events``, ...); a ``pool`` here wins over ``celeriac_worker_pool``."""
    return dict(celery_worker_parameters)


# -- the app and the worker ---------------------------------------------------------------
@pytest.fixture
def celeriac_app(request: pytest.FixtureRequest, celeriac_config: Mapping[str, Any],
                 celeriac_parameters: Mapping[str, Any],
                 celeriac_includes: Sequence[str]) -> Iterator[Celeriac]:
    """A fresh app per test, from the config fixtures and the test's markers; closed after
    the test."""
    app = create_app(celeriac_config, celeriac_parameters, marker_settings(request.node))
    try:
        include(app, celeriac_includes)
        yield app
    finally:
        app.close()


@pytest.fixture
def celery_app(celeriac_app: Celeriac) -> Celeriac:
    """Celery's name for ``celeriac_app``; what ``celeriac_worker`` runs on."""
    return celeriac_app


@pytest.fixture
def celeriac_worker(celery_app: Celeriac, celeriac_worker_pool: str,
                    celeriac_worker_parameters: Mapping[str, Any]) -> Iterator[ThreadedWorker]:
    """A real worker on the test app, in a thread of this process; stopped after the test.

    It takes ``celery_app``, not ``celeriac_app``, so that overriding either reaches it.
    Tasks are looked up when a message arrives, so a task the test defines after this
    fixture started still runs. Any broker works; with ``memory://`` the worker must be in
    this process, which it is.
    """
    worker = ThreadedWorker(celery_app, **{"pool": celeriac_worker_pool,
                                           **celeriac_worker_parameters})
    try:
        worker.start()
    except BaseException:
        worker.stop(cold=True)  # a start that timed out may have left the thread running
        raise
    try:
        yield worker
    finally:
        # Warm: a task the test left running finishes, as it would in production.
        worker.stop()
    check_stopped(worker)


@pytest.fixture
def celery_worker(celeriac_worker: ThreadedWorker) -> ThreadedWorker:
    """Celery's name for ``celeriac_worker``."""
    return celeriac_worker


@pytest.fixture
def depends_on_current_app(celery_app: Celeriac) -> None:
    """Make ``celery_app`` the current app for the test (Celery's fixture)."""
    celery_app.set_current()


# -- the session's app and worker (Celery's) ----------------------------------------------
@pytest.fixture(scope="session")
def celery_class_tasks() -> Sequence[type[Task[Any, Any]]]:
    """Class-based tasks (``class T(Task)`` with ``run``) the session app registers."""
    return ()


@pytest.fixture(scope="session")
def celeriac_session_app(celeriac_config: Mapping[str, Any],
                         celeriac_parameters: Mapping[str, Any],
                         celeriac_includes: Sequence[str]) -> Iterator[Celeriac]:
    """One app for the whole run, made as ``celeriac_app`` makes one (markers aside: a
    session has none), and the current and default app; closed at the end."""
    app = create_app(celeriac_config, celeriac_parameters)
    try:
        include(app, celeriac_includes)
        app.set_default()
        app.set_current()
        yield app
    finally:
        app.close()


@pytest.fixture(scope="session")
def celery_session_app(celeriac_session_app: Celeriac) -> Celeriac:
    """Celery's name for ``celeriac_session_app``; what ``celeriac_session_worker`` runs
    on."""
    return celeriac_session_app


@pytest.fixture(scope="session")
def celeriac_session_worker(celery_session_app: Celeriac,
                            celery_class_tasks: Sequence[type[Task[Any, Any]]],
                            celeriac_worker_pool: str,
                            celeriac_worker_parameters: Mapping[str, Any]
                            ) -> Iterator[ThreadedWorker]:
    """A real worker on the session app for the whole run, in a thread of this process
    (``start_worker``); stopped, warm, at the end."""
    for task in celery_class_tasks:
        celery_session_app.register_task(task)
    options = {"pool": celeriac_worker_pool, **celeriac_worker_parameters}
    with start_worker(celery_session_app, **options) as worker:
        yield worker


@pytest.fixture(scope="session")
def celery_session_worker(celeriac_session_worker: ThreadedWorker) -> ThreadedWorker:
    """Celery's name for ``celeriac_session_worker``."""
    return celeriac_session_worker


# -- helpers (public: a session-scoped fixture of the user's own can use them) ------------
def create_app(config: Mapping[str, Any], parameters: Mapping[str, Any],
               overrides: Mapping[str, Any] | None = None) -> Celeriac:
    """An app from settings ``config``, ``Celeriac()`` keywords ``parameters`` and
    marker ``overrides``; later ones win: ``parameters["settings"]``, ``config``, the
    other parameters, ``overrides``."""
    params = dict(parameters)
    main: str | None = params.pop("main", DEFAULT_MAIN)
    base: Settings = params.pop("settings", None) or Settings()
    # Celeriac() lets broker=/backend= beat any setting; here a marker must beat them, so
    # they become the settings they stand for.
    if "broker" in params:
        params["broker_url"] = params.pop("broker")
    if "backend" in params:
        params["result_backend"] = params.pop("backend")
    settings = base.replace(**{**config, **params, **(overrides or {})})
    return Celeriac(main, settings=_own_memory_broker(settings))


def _own_memory_broker(settings: Settings) -> Settings:
    # memory:// brokers and result stores are shared by URL for the whole process: with
    # one bare URL, a message a test left behind would reach the next test's worker.
    private = f"memory://pytest-{uuid.uuid4().hex}"
    changes = {name: private for name in ("broker_url", "result_backend")
               if _is_bare_memory(getattr(settings, name))}
    return settings.replace(**changes) if changes else settings


def _is_bare_memory(url: str | None) -> bool:
    return url is not None and url.rstrip("/") == "memory:"


class Marked(Protocol):
    """What ``marker_settings`` needs of a pytest node (``request.node``)."""

    def iter_markers(self, name: str | None = None) -> Iterator[pytest.Mark]: ...


def marker_settings(node: Marked) -> dict[str, Any]:
    """The settings of the ``celeriac``/``celery`` markers on ``node``, its class and its
    module, the closest winning."""
    marks = [m for m in node.iter_markers() if m.name in MARKERS]
    settings: dict[str, Any] = {}
    for mark in reversed(marks):  # iter_markers yields the closest first; it applies last
        if mark.args:
            pytest.fail(f"@pytest.mark.{mark.name} takes settings as keywords only, got "
                        f"{mark.args!r}", pytrace=False)
        settings.update(mark.kwargs)
    return settings


def include(app: Celeriac, modules: Sequence[str]) -> None:
    """Import ``modules`` and register on ``app`` the tasks at their top level."""
    for name in modules:
        module = importlib.import_module(name)
        for value in list(vars(module).values()):
            if isinstance(value, Task) and value.app is not app:
                # A copy bound to the test app: retries and the settings it reads are the
                # test app's; the module's own task object is left as it was.
                app.tasks[value.name] = Task(app, value.fn, value.options)


def check_stopped(worker: ThreadedWorker) -> None:
    """Fail the test's teardown if ``worker`` crashed or did not stop."""
    if worker.error is not None:
        raise worker.error
    if worker.exit_code is None:
        pytest.fail("celeriac_worker did not stop within 10 s of the test's end; a task "
                    "still running?", pytrace=False)
    if worker.exit_code != 0:
        failure = worker.worker.failure or "see its log"
        pytest.fail(f"celeriac_worker exited with {worker.exit_code}: {failure}",
                    pytrace=False)
