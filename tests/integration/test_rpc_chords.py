"""Chords and ``rpc://`` (issue 28: "chords are refused on rpc:// unless a shared store
exists"): which combinations of broker and ``rpc://`` can exist, and that none of them
has a shared store, so the refusal holds for every one and says what makes chords work.

The combinations need no server: ``rpc://`` checks its broker when the backend is made,
and a chord is refused before its reply queue is declared or a message sent (the same
refusal with a live worker: ``test_rpc_backend.py``; chords on RabbitMQ with results on
Redis: ``test_canvas_brokers.py``). The last test runs a real worker on RabbitMQ with
``rpc://`` results: a chord header task that reaches it anyway is refused unrun.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from celeriac import Celeriac, Settings, chord, group
from celeriac.backends.rpc import NotSupportedByRPC
from celeriac.canvas.signature import plain
from celeriac.errors import ConfigurationError, DecodeError
from celeriac.stores import find_url, store_url
from celeriac.testing import WorkerProcess
from tests.integration import app_tasks as t
from tests.services import require

AMQP = "amqp://guest:guest@127.0.0.1:5672//"
ROOT = Path(__file__).resolve().parent.parent.parent


def _add(x: int, y: int) -> int:
    return x + y


def _total(xs: list[int]) -> int:
    return sum(xs)


def _ns() -> str:
    return f"?namespace=t{uuid.uuid4().hex[:12]}"


@pytest.mark.parametrize("broker", [
    "redis://127.0.0.1:6379/0", "sqlite:///{tmp}/broker.db", "memory://",
    f"{AMQP};redis://127.0.0.1:6379/0",  # a failover list that strays off AMQP
])
def test_rpc_takes_only_an_amqp_broker_so_no_broker_brings_a_store(
        broker: str, tmp_path: Path) -> None:
    """The brokers that would bring a shared store (Redis, SQLite) cannot carry rpc://:
    the backend refuses them when it is made, before any chord could be sent."""
    app = Celeriac(f"h9-{uuid.uuid4().hex[:6]}", broker=broker.format(tmp=tmp_path),
                   backend="rpc://")
    try:
        with pytest.raises(ConfigurationError, match="replies through an AMQP broker"):
            app.backend  # noqa: B018 - made on first use
    finally:
        app.close()


@pytest.mark.parametrize("backend", ["rpc://", "rpc"])
def test_on_rabbitmq_with_rpc_there_is_no_shared_store_and_chords_are_refused(
        backend: str) -> None:
    app = Celeriac(f"h9-{uuid.uuid4().hex[:6]}", broker=AMQP + _ns(), backend=backend)
    try:
        assert find_url(app.settings) is None
        with pytest.raises(ConfigurationError, match="needs a store every process shares"):
            store_url(app.settings, "a chord")
        with pytest.raises(NotSupportedByRPC, match="does not support chords") as refused:
            app.backend.ensure_chords_allowed()
        # The reason says why no store helps, and what does: a storing result backend.
        reason = str(refused.value)
        assert "needs an AMQP broker" in reason
        assert "redis://, postgresql://, mysql:// or sqlite://" in reason
        assert "the broker can stay amqp://" in reason
        # Both spellings of a chord stop there, before anything is sent.
        add = app.task(name="h9.add")(_add)
        total = app.task(name="h9.total")(_total)
        with pytest.raises(NotSupportedByRPC, match="needs an AMQP broker"):
            chord(add.s(i, i) for i in range(3))(total.s())
        with pytest.raises(NotSupportedByRPC, match="needs an AMQP broker"):
            (group(add.s(i, i) for i in range(3)) | total.s()).apply_async()
    finally:
        app.close()


@pytest.mark.parametrize("backend", [
    "redis://127.0.0.1:6379/0", "sqlite:///{tmp}/results.db",
    "postgresql://postgres@127.0.0.1:5432/test", "mysql://root@127.0.0.1:3306/test"])
def test_beside_rabbitmq_a_storing_backend_allows_chords(backend: str, tmp_path: Path
                                                         ) -> None:
    """What the refusal points to: the broker stays RabbitMQ, the results go to a store
    (which is the shared store too, except MySQL's, which counts chords itself)."""
    url = backend.format(tmp=tmp_path)
    app = Celeriac(f"h9-{uuid.uuid4().hex[:6]}", broker=AMQP + _ns(), backend=url)
    try:
        app.backend.ensure_chords_allowed()  # returns: chords are counted there
        assert find_url(app.settings) == (None if url.startswith("mysql") else url)
    finally:
        app.close()


@pytest.fixture
def rpc_worker(tmp_path: Path) -> Iterator[WorkerProcess]:
    """A real worker on RabbitMQ with rpc:// results, and ``t.app`` as its caller."""
    env = {"CELERIAC_BROKER_URL": require("rabbitmq") + _ns(),
           "CELERIAC_RESULT_BACKEND": "rpc://", "PYTHONPATH": str(ROOT)}
    before = t.app.settings
    t.app.close()
    t.app.settings = Settings.from_env(env)
    w = WorkerProcess("tests.integration.app_tasks", "-c", "1", "-P", "prefork", env=env,
                      cwd=str(tmp_path))
    try:
        w.start(30)
        yield w
    finally:
        w.kill()
        t.app.close()
        t.app.settings = before


@pytest.mark.slow
def test_a_worker_on_rpc_refuses_a_chord_header_task_once_and_says_why(
        rpc_worker: WorkerProcess) -> None:
    """A chord's header task sent by a producer that does not check (one configured with
    another backend, or by hand): the worker cannot count it, so it refuses it unrun, at
    its first delivery, and the caller reads why, instead of the task running again at
    each redelivery until it is dead-lettered as lost."""
    body = {**plain(t.total.s()), "chord_size": 1}
    r = t.add.s(1, 2).apply_async(chord=body, group_id=uuid.uuid4().hex, group_index=0)
    with pytest.raises(DecodeError, match="does not support chords"):
        r.get(timeout=20)
    rpc_worker.wait_for_log(rf"add\[{r.id}\] dead-lettered: embed 'chord'", 15)
    assert f"add[{r.id}] succeeded" not in rpc_worker.log
