"""What the integration tests share: a namespace of the test's own on the shared Redis, a
tasks module's app pointed at it, and real workers that are killed after the test.

A test module builds its fixtures from these in a few lines::

    @pytest.fixture
    def env() -> Iterator[dict[str, str]]:
        with redis_env("rl", WORKER_LEASE_TIMEOUT=2.0) as e:
            yield e
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from celeriac import Celeriac, Settings
from celeriac.testing import WorkerProcess
from tests.contracts.conftest import _drop_redis_namespace
from tests.services import require

ROOT = Path(__file__).parent.parent.parent


@contextmanager
def redis_env(prefix: str, **settings: Any) -> Iterator[dict[str, str]]:
    """Worker and producer environment on a namespace of the shared Redis (broker and
    results), with ``settings`` as ``CELERIAC_*`` variables; its keys deleted after.
    The namespace is ``env["NAMESPACE"]``."""
    ns = f"{prefix}{uuid.uuid4().hex[:12]}"
    url = f"{require('redis')}?namespace={ns}"
    env = {"CELERIAC_BROKER_URL": url, "CELERIAC_RESULT_BACKEND": url,
           "PYTHONPATH": str(ROOT), "NAMESPACE": ns,
           **{f"CELERIAC_{k.upper()}": str(v) for k, v in settings.items()}}
    try:
        yield env
    finally:
        _drop_redis_namespace(url)


@contextmanager
def bound(app: Celeriac, env: dict[str, str]) -> Iterator[Celeriac]:
    """A tasks module's ``app``, in this process (the producer), on ``env``'s settings;
    as it was after."""
    before = app.settings
    app.close()
    app.settings = Settings.from_env(env)
    try:
        yield app
    finally:
        app.close()
        app.settings = before


class Workers:
    """Starts ``celeriac -A module worker`` processes; ``kill_all`` after the test."""

    def __init__(self, module: str, env: dict[str, str], cwd: Path, *args: str) -> None:
        self.module, self.env, self.cwd, self.args = module, env, cwd, args
        self.started: list[WorkerProcess] = []

    def start(self, *args: str, wait_ready: bool = True,
              extra_env: dict[str, str] | None = None) -> WorkerProcess:
        w = WorkerProcess(self.module, *self.args, *args, env={**self.env, **(extra_env or {})},
                          cwd=str(self.cwd))
        self.started.append(w)
        return w.start(wait_ready=wait_ready)

    def kill_all(self) -> None:
        for w in self.started:
            w.kill()


@contextmanager
def workers(module: str, env: dict[str, str], cwd: Path, *args: str) -> Iterator[Workers]:
    pool = Workers(module, env, cwd, *args)
    try:
        yield pool
    finally:
        pool.kill_all()
