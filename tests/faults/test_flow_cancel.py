"""Cancelling running tasks (issue 29, flow control): ``revoke(terminate=True)`` on the
threads pool asks a running sync task to stop (``self.is_aborted()``), and it ends
``REVOKED``; a revoked chord member, sync or async, makes the chord's body fail with
``ChordError`` naming it, as Celery's worker does. One threads-pool worker on each
shared store (``tests/integration/flow_stores.py``): Redis; PostgreSQL results with a
Redis broker; SQLite broker and results.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from celeriac import Celeriac, chord, states
from celeriac.errors import ChordError, TaskRevoked
from celeriac.testing import WorkerProcess, wait_until
from tests.faults import flow_tasks as ft
from tests.integration.flow_stores import STORES, store_env
from tests.integration.support import bound, workers

pytestmark = pytest.mark.slow

NODE = "flowcancel@test"


@pytest.fixture(scope="module", params=STORES)
def env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[dict[str, str]]:
    with store_env(request.param, "flc", tmp_path_factory.mktemp("db"),
                   WORKER_LEASE_TIMEOUT=2.0) as e:
        yield e


@pytest.fixture(scope="module")
def app(env: dict[str, str]) -> Iterator[Celeriac]:
    with bound(ft.app, env) as a:
        yield a


@pytest.fixture(scope="module")
def worker(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[WorkerProcess]:
    with workers("tests.faults.flow_tasks", env, tmp_path_factory.mktemp("w"),
                 "-n", NODE) as w:
        yield w.start("-P", "threads", "-c", "3")


def terminate(app: Celeriac, task_id: str) -> object:
    return app.control.revoke(task_id, terminate=True, reply=True, destination=[NODE],
                              timeout=5)


def started(marks: Path, task_id: str) -> None:
    wait_until(lambda: any(f.name.endswith(task_id) for f in marks.iterdir()), 20,
               message=f"{task_id} started")


def test_threads_pool_sync_task_aborted_ends_revoked(
        app: Celeriac, worker: WorkerProcess, tmp_path: Path) -> None:
    r = ft.patient.delay(str(tmp_path), 60)
    started(tmp_path, r.id)
    began = time.monotonic()
    assert terminate(app, r.id) == [{NODE: {"ok": f"terminate: {r.id}"}}]
    with pytest.raises(TaskRevoked, match="aborted on the threads pool"):
        r.get(timeout=10)
    print(f"\nthreads pool sync abort: REVOKED {(time.monotonic() - began) * 1000:.0f} ms "
          "after the command")
    assert r.state == states.REVOKED
    worker.wait_for_log(rf"{r.id}\] revoked: asking it to stop")


def test_revoked_chord_members_fail_the_body_with_chord_error(
        app: Celeriac, worker: WorkerProcess, tmp_path: Path) -> None:
    sync_member = ft.patient.s(str(tmp_path), 60)
    async_member = ft.waits.s(str(tmp_path), 60)
    res = chord([sync_member, async_member, ft.collect.s([])], ft.collect.s()).apply_async()
    header = res.parent
    assert header is not None
    ids = [m.id for m in header.results]
    for task_id in ids[:2]:
        started(tmp_path, task_id)
    for task_id in ids[:2]:
        assert terminate(app, task_id) == [{NODE: {"ok": f"terminate: {task_id}"}}]
    with pytest.raises(ChordError, match=r"Dependency .* raised REVOKED"):
        res.get(timeout=15, follow_parents=False)
    assert [app.AsyncResult(i).state for i in ids] == [states.REVOKED, states.REVOKED,
                                                       states.SUCCESS]


def test_a_chord_member_revoked_before_it_runs_fails_the_body_too(
        app: Celeriac, worker: WorkerProcess, tmp_path: Path) -> None:
    header = [ft.collect.s([i]) for i in range(3)]
    c = chord(header, ft.collect.s())
    res = c.freeze()
    members = [sig.options["task_id"] for sig in c.tasks]
    app.control.revoke(members[1])  # recorded in the store and broadcast first
    sent = c.apply_async()
    assert sent.id == res.id
    with pytest.raises(ChordError, match=rf"Dependency {members[1]} raised REVOKED"):
        sent.get(timeout=15, follow_parents=False)
    assert app.AsyncResult(members[1]).state == states.REVOKED
