"""Flow control on each shared store (issue 29): Redis; PostgreSQL results with a Redis
broker; SQLite. (Unique jobs and per-key limits with a worker: ``test_flow_control.py``;
unique workflow steps: ``test_unique_followups.py``; both over the same stores.)

- A unique lock taken for a message that was never published is let go at once: the
  producer's broker refuses the publish (a Redis URL on a port where nothing listens)
  after the lock was taken in a working store, or a workflow step cannot be serialized
  after the steps before it in its chunk took theirs. Without the release the lock would
  keep the next ``delay()`` out until ``unique_for`` lapsed. No worker: nothing is ever
  published.
- With a real worker (prefork, 4 children) per store: a cluster-wide ``concurrency=2``
  (no key) is never passed, and ``revoke(terminate=True)`` cancels a running ``async
  def`` task."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celeriac import Celeriac, chain, group, states
from celeriac.canvas import followups
from celeriac.canvas.signature import plain
from celeriac.errors import EncodeError, OperationalError, TaskRevoked
from celeriac.hooks import Hooks
from celeriac.producer.flow import lock_name
from celeriac.stores import SharedStore, store_for
from celeriac.testing import WorkerProcess, wait_until
from tests.faults.flow_tasks import most_at_once
from tests.integration import flow_stores_tasks as fst
from tests.integration.flow_stores import STORES, store_env
from tests.integration.support import bound, workers

pytestmark = pytest.mark.slow

UNIQUE_FOR = 300  # far longer than the test: a lock still held is the bug


@pytest.fixture(scope="module")
def refused() -> Iterator[str]:
    """A Redis URL whose port is bound but not listening: every connect is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"redis://127.0.0.1:{s.getsockname()[1]}/0"


@pytest.fixture(params=STORES)
def app(request: pytest.FixtureRequest, refused: str, tmp_path: Path) -> Iterator[Celeriac]:
    with store_env(request.param, "fst", tmp_path) as env:
        app = Celeriac("fst", broker=refused, backend=env["CELERIAC_RESULT_BACKEND"],
                       broker_connection_max_retries=0, broker_connection_timeout=1.0)
        try:
            yield app
        finally:
            app.close()


@pytest.fixture
def store(app: Celeriac) -> Iterator[SharedStore]:
    s = store_for(app.settings, "test")
    yield s
    s.close()


def holders_at_publish(app: Celeriac, store: SharedStore) -> dict[str, str | None]:
    """task id -> the holder of its unique lock as its message goes to the broker."""
    seen: dict[str, str | None] = {}

    def before_publish(self: Any, message: Any, queue: str) -> None:
        lock = (message.headers.get("celeriac_unique") or [None])[0]
        seen[message.headers["id"]] = store.holder(lock) if lock else None

    app.add_hooks(type("Spy", (Hooks,), {"before_publish": before_publish})())
    return seen


def test_a_refused_group_or_chain_lets_its_unique_locks_go(
        app: Celeriac, store: SharedStore) -> None:
    @app.task(name="fst.once", unique_for=UNIQUE_FOR)
    def once(x: Any) -> Any:
        return x

    @app.task(name="fst.plain")
    def plain(x: Any) -> Any:
        return x

    seen = holders_at_publish(app, store)
    with pytest.raises(OperationalError):
        group([once.si(1), plain.si(0), once.si(2)]).apply_async(retry=False)
    with pytest.raises(OperationalError):
        chain(once.si(3), plain.s()).apply_async(retry=False)
    # The locks were taken (each message held its own as it went out)...
    assert len(seen) == 4 and all(seen[i] == i for i in seen if seen[i] is not None)
    assert sum(h is not None for h in seen.values()) == 3
    # ... and let go when the broker refused them.
    for x in (1, 2, 3):
        assert store.holder(lock_name("fst.once", (x,), {}, None)) is None
    with pytest.raises(OperationalError):  # a lone delay() as well (it always did)
        once.delay(4)
    assert store.holder(lock_name("fst.once", (4,), {}, None)) is None


def test_a_step_that_cannot_be_serialized_lets_its_chunks_locks_go(
        app: Celeriac, store: SharedStore, caplog: pytest.LogCaptureFixture) -> None:
    @app.task(name="fst.once", unique_for=UNIQUE_FOR)
    def once(x: Any) -> Any:
        return x

    caplog.set_level(logging.DEBUG, logger="celeriac.producer.flow")
    unserializable = object()
    with pytest.raises(EncodeError):
        group([once.si(5), once.si(unserializable)]).apply_async(retry=False)
    assert store.holder(lock_name("fst.once", (5,), {}, None)) is None
    assert store.holder(lock_name("fst.once", (unserializable,), {}, None)) is None
    released = [r.getMessage() for r in caplog.records if "not published" in r.getMessage()]
    assert len(released) == 2, released  # both steps had taken a lock: both let go


def test_a_follow_up_a_worker_cannot_send_lets_its_lock_go(
        app: Celeriac, store: SharedStore) -> None:
    """What a worker sends after a task (``canvas.followups.send``, called here as the
    worker calls it): a refused publish, or a parent's result that cannot be serialized
    as the step's argument."""
    @app.task(name="fst.once", unique_for=UNIQUE_FOR)
    def once(x: Any) -> Any:
        return x

    seen = holders_at_publish(app, store)
    lineage = {"parent_id": "parent", "root_id": "root"}
    with pytest.raises(OperationalError):
        followups.send(app, plain(once.si(6)), (), lineage)
    assert list(seen.values()) == list(seen) and len(seen) == 1  # it held the lock
    assert store.holder(lock_name("fst.once", (6,), {}, None)) is None
    unserializable = object()
    with pytest.raises(EncodeError):
        followups.send(app, plain(once.s()), (unserializable,), lineage)
    assert store.holder(lock_name("fst.once", (unserializable,), {}, None)) is None


# -- with a worker --------------------------------------------------------------------
@pytest.fixture(scope="module", params=STORES)
def wenv(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[dict[str, str]]:
    with store_env(request.param, "fsw", tmp_path_factory.mktemp("db"),
                   WORKER_LEASE_TIMEOUT=2.0) as e:
        yield e


@pytest.fixture(scope="module")
def wapp(wenv: dict[str, str]) -> Iterator[Celeriac]:
    with bound(fst.app, wenv) as a:
        yield a


@pytest.fixture(scope="module")
def worker(wenv: dict[str, str], tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[WorkerProcess]:
    with workers("tests.integration.flow_stores_tasks", wenv,
                 tmp_path_factory.mktemp("w")) as w:
        yield w.start("-c", "4")


def test_a_cluster_wide_limit_is_never_passed_and_nothing_is_dropped(
        wapp: Celeriac, worker: WorkerProcess, tmp_path: Path) -> None:
    results = [fst.capped.delay(str(tmp_path), 0.5) for _ in range(6)]
    assert [r.get(timeout=30) for r in results] == ["ok"] * 6
    # Four children, a limit of two: two ran at once at some point, never three.
    assert most_at_once(str(tmp_path), "capped") == 2


def test_terminate_cancels_a_running_async_task(
        wapp: Celeriac, worker: WorkerProcess, tmp_path: Path) -> None:
    r = fst.waits.delay(str(tmp_path), 60)
    wait_until(lambda: (tmp_path / f"waits-{r.id}").exists(), 20, message="it started")
    r.revoke(terminate=True)
    with pytest.raises(TaskRevoked):
        r.get(timeout=20)
    assert r.state == states.REVOKED
