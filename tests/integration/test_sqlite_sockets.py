"""No SQLite doorbell socket is left for the garbage collector to close.

The SQLite broker and result backend wake waiters through Unix datagram sockets (a
``Doorbell``'s sender, a ``Listener``). One dropped unclosed ends as ``ResourceWarning:
unclosed <socket.socket ... family=1, type=2 ...>`` wherever the collector happens to run:
under the pytest plugin's ``filterwarnings = error``, a failure of whatever test runs
then. The one seen: the app's lazily made result backend, asked for first at the same
moment by the test's ``get()`` and the solo pool's first task, was made twice and the one
overwritten was never closed.

Each test records the ``ResourceWarning``s raised while it runs, collecting garbage
(``gc.collect()``) before it looks, so that a leak in a reference cycle shows in the test
that made it, not in some later one.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

from celeriac import Celeriac, states
from celeriac.testing import ThreadedWorker

THREADS = 4
ROUNDS = 30


@contextlib.contextmanager
def watching() -> Iterator[Callable[[], list[str]]]:
    """Used inside a test's body (pytest sets its own warning filters for each phase): a
    call that collects garbage and returns the unclosed sockets' warnings so far."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)

        def unclosed() -> list[str]:
            gc.collect()
            return [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)
                    and "unclosed <socket" in str(w.message)]

        yield unclosed


@contextlib.contextmanager
def switching_often() -> Iterator[None]:
    # A thread switch every microsecond: threads interleave inside the app's properties,
    # as two loaded cores make them do now and then.
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _app(db: Path, **settings: object) -> Celeriac:
    return Celeriac("sockets", broker=f"sqlite:///{db}", set_as_current=False, **settings)


def _first_use(app: Celeriac, barrier: threading.Barrier,
               seen: list[tuple[object, object]]) -> None:
    barrier.wait()
    transport, backend = app.transport, app.backend
    seen.append((transport, backend))
    # What the two callers of the race seen do next: one waits (a listener), the other
    # stores (a ring: the doorbell's sender socket).
    backend.get(uuid.uuid4().hex)
    backend.store(uuid.uuid4().hex, states.SUCCESS, 1)


def test_threads_asking_first_at_once_share_one_backend_and_transport(
        tmp_path: Path) -> None:
    with watching() as unclosed, switching_often():
        for n in range(ROUNDS):
            app = _app(tmp_path / f"round{n}.db")
            seen: list[tuple[object, object]] = []
            barrier = threading.Barrier(THREADS)
            threads = [threading.Thread(target=_first_use, args=(app, barrier, seen))
                       for _ in range(THREADS)]
            try:
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(30)
                assert len(seen) == THREADS
                assert len({id(t) for t, _ in seen}) == 1, f"round {n}: two transports"
                assert len({id(b) for _, b in seen}) == 1, f"round {n}: two backends"
            finally:
                seen.clear()
                app.close()
        assert unclosed() == []


def test_a_worker_started_and_stopped_leaves_no_socket_unclosed(tmp_path: Path) -> None:
    # Every step that reaches the broker on its own (events, mingle, control, gossip)
    # and the result backend, on SQLite, with the settings of the test seen failing.
    app = _app(tmp_path / "worker.db", task_track_started=True)

    @app.task
    def add(x: int, y: int) -> int:
        gc.collect()  # a collection during the task, where the one seen in CI ran
        return x + y

    with watching() as unclosed:
        try:
            with ThreadedWorker(app, task_events=True) as worker:
                result = add.delay(2, 2)
                assert result.get(timeout=30) == 4
                assert result.state == states.SUCCESS
                assert unclosed() == []
            assert worker.error is None and worker.exit_code == 0
        finally:
            app.close()
        assert unclosed() == []
