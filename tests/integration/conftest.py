from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from celeriac import Celeriac, Settings
from celeriac.testing import WorkerProcess

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


@pytest.fixture
def env(sqlite_url: str) -> dict[str, str]:
    """Settings shared by the test process and its worker subprocesses."""
    return {
        "CELERIAC_BROKER_URL": sqlite_url,
        "CELERIAC_WORKER_LEASE_TIMEOUT": "1.0",
        "PYTHONPATH": str(ROOT),
    }


@pytest.fixture(scope="module")
def module_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """``env`` for a module whose tests share one worker (a module-scoped fixture cannot
    use the per-test ``env``): one SQLite database for the module's tests."""
    return {
        "CELERIAC_BROKER_URL": f"sqlite:///{tmp_path_factory.mktemp('module')}/celeriac.db",
        "CELERIAC_WORKER_LEASE_TIMEOUT": "1.0",
        "PYTHONPATH": str(ROOT),
    }


@pytest.fixture
def app(env: dict[str, str]) -> Iterator[Celeriac]:
    """The tasks module's app, pointed at this test's database."""
    from tests.integration import app_tasks

    before = app_tasks.app.settings
    app_tasks.app.close()
    app_tasks.app.settings = Settings.from_env(env)
    yield app_tasks.app
    app_tasks.app.close()
    app_tasks.app.settings = before


@pytest.fixture
def start_worker(env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(*args: str, extra_env: dict[str, str] | None = None, wait_ready: bool = True
              ) -> WorkerProcess:
        w = WorkerProcess("tests.integration.app_tasks", *args, env={**env, **(extra_env or {})},
                          cwd=str(tmp_path))
        started.append(w)
        return w.start(wait_ready=wait_ready)

    yield start
    for w in started:
        w.kill()
