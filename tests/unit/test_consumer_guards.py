"""Nothing that escapes the consumer leaves a worker alive and idle with work waiting:
a message whose checks raise is refused (dead letter, FAILURE, one traceback) and the
next one runs; a pool that fails to take a job stops the worker with exit code 1."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator

import pytest

from celeriac import Celeriac
from celeriac.errors import CeleriacError
from celeriac.protocol import Message
from celeriac.testing import ThreadedWorker, wait_until
from celeriac.worker.admission import Admission, Refusal
from celeriac.worker.pool.solo import SoloPool


@pytest.fixture
def app() -> Iterator[Celeriac]:
    url = f"memory://{uuid.uuid4().hex}"
    app = Celeriac("t", broker=url, backend=url, worker_lease_timeout=2.0)

    @app.task(name="t.add")
    def add(x: int, y: int) -> int:
        return x + y

    yield app
    app.close()


def test_a_check_that_raises_refuses_that_message_only(
        app: Celeriac, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = Admission.check

    def check(self: Admission, message: Message) -> Refusal | None:
        if message.headers.get("argsrepr") == "(13, 0)":
            raise RuntimeError("a check with a bug")
        return real(self, message)

    monkeypatch.setattr(Admission, "check", check)
    with caplog.at_level(logging.ERROR), ThreadedWorker(app):
        bad = app.send_task("t.add", (13, 0))
        good = app.send_task("t.add", (2, 2))
        assert good.get(timeout=5) == 4
        with pytest.raises(CeleriacError, match="RuntimeError: a check with a bug"):
            bad.get(timeout=5)
    [dead] = app.transport.dead_letters()
    assert dead.message.headers["id"] == bad.id
    assert "the worker could not take it: RuntimeError: a check with a bug" in dead.reason
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1 and "could not take message" in tracebacks[0].getMessage()


def test_a_pool_that_fails_to_take_a_job_stops_the_worker_with_exit_1(
        app: Celeriac, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def submit(self: SoloPool, job: object) -> None:
        raise OSError("the pool's books are wrong")

    monkeypatch.setattr(SoloPool, "submit", submit)
    w = ThreadedWorker(app)
    with caplog.at_level(logging.CRITICAL):
        w.start()
        app.send_task("t.add", (1, 1))
        wait_until(lambda: w.exit_code is not None, 10, message="the worker exited")
    assert w.exit_code == 1
    assert w.worker.failure is not None and "the pool's books are wrong" in w.worker.failure
    assert any(r.exc_info for r in caplog.records if r.levelno == logging.CRITICAL)
    # Nothing lost: the cold stop gave the message back.
    assert app.transport.queue_length("celery") == 1


def test_a_second_interrupt_right_after_the_first_is_a_cold_stop(app: Celeriac) -> None:
    # Two Ctrl-Cs handled in one turn of the loop, before the warm stop has begun: the
    # second must not be lost, or the worker waits for a task that may run for hours.
    started, release = threading.Event(), threading.Event()

    @app.task(name="t.block")
    def block() -> None:
        started.set()
        release.wait(30)

    w = ThreadedWorker(app).start()
    try:
        app.send_task("t.block")
        assert started.wait(10), "the task did not start"

        def twice() -> None:
            w.worker.shutdown(False)
            w.worker.shutdown(True)

        assert w._loop is not None
        w._loop.call_soon_threadsafe(twice)
        wait_until(lambda: w.exit_code is not None, 10, message="the worker stopped cold")
        assert app.transport.queue_length("celery") == 1  # given back, not waited for
    finally:
        release.set()
        w.stop()
