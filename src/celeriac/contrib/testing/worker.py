"""Celery's ``celery.contrib.testing.worker``: ``start_worker(app)``, a real worker in a
thread of the test process for the length of a ``with`` block.

The worker is ``celeriac.testing.ThreadedWorker``: its own event loop in a thread, on the
app's broker, named ``gen<pid>@<host>`` (``anon_nodename``) unless ``hostname=`` says
otherwise, without mingle and gossip (and heartbeats, unless ``without_heartbeat=False``)
as Celery's test worker. With ``perform_ping_check`` it runs ``celery.ping`` before the
block starts, so the block begins with a worker that consumes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ...signals import Signal
from ...testing import ThreadedWorker
from ...utils.nodenames import anon_nodename
from . import tasks as _tasks

if TYPE_CHECKING:
    from ...app import Celeriac

WORKER_LOGLEVEL = os.environ.get("WORKER_LOGLEVEL", "error")

test_worker_starting = Signal("test_worker_starting")
test_worker_started = Signal("test_worker_started", ("worker", "consumer"))
test_worker_stopped = Signal("test_worker_stopped", ("worker",))

PING_TASK = _tasks.PING


@contextmanager
def start_worker(app: Celeriac, concurrency: int = 1, pool: str = "solo",
                 loglevel: str | int = WORKER_LOGLEVEL, logfile: str | None = None,
                 perform_ping_check: bool = True, ping_task_timeout: float = 10.0,
                 shutdown_timeout: float = 10.0, **kwargs: Any) -> Iterator[ThreadedWorker]:
    """Start a worker on ``app`` in a thread; stop it (warm) when the block ends.

    ``kwargs`` are ``Worker`` keywords (``queues``, ``task_events``...). Raises
    ``RuntimeError`` if the worker has not stopped ``shutdown_timeout`` seconds after
    the block, as Celery's does."""
    test_worker_starting.send(sender=app)
    worker: ThreadedWorker | None = None
    try:
        with _logging(loglevel, logfile):
            worker = _start(app, concurrency, pool, kwargs)
            try:
                test_worker_started.send(sender=app, worker=worker, consumer=None)
                if perform_ping_check:
                    pong = app.send_task(PING_TASK).get(timeout=ping_task_timeout)
                    assert pong == "pong", f"celery.ping answered {pong!r}"
                yield worker
            finally:
                worker.stop(timeout=shutdown_timeout)
            if worker.exit_code is None:
                raise RuntimeError("Worker thread failed to exit within the allocated "
                                   "timeout. Consider raising `shutdown_timeout` if your "
                                   "tasks take longer to execute.")
            if worker.error is not None:
                raise worker.error
    finally:
        test_worker_stopped.send(sender=app, worker=worker)


def _start(app: Celeriac, concurrency: int, pool: str, kwargs: dict[str, Any]
           ) -> ThreadedWorker:
    app.finalize()
    app.set_current()
    options = dict(kwargs)
    options.setdefault("hostname", anon_nodename())
    options["heartbeat"] = not options.pop("without_heartbeat", True)
    options["mingle"] = not options.pop("without_mingle", True)
    options["gossip"] = not options.pop("without_gossip", True)
    if pool != "solo":
        options["concurrency"] = concurrency
    worker = ThreadedWorker(app, pool=pool, **options)
    try:
        worker.start()
    except BaseException:
        worker.stop(cold=True)  # a start that timed out may have left the thread running
        raise
    return worker


@contextmanager
def _logging(loglevel: str | int, logfile: str | None) -> Iterator[None]:
    """celeriac's loggers at ``loglevel`` (and into ``logfile``) while the worker runs."""
    logger = logging.getLogger("celeriac")
    level = logging.getLevelName(loglevel.upper()) if isinstance(loglevel, str) else loglevel
    before = logger.level
    handler = logging.FileHandler(logfile) if logfile else None
    logger.setLevel(level if isinstance(level, int) else logging.ERROR)
    if handler is not None:
        logger.addHandler(handler)
    try:
        yield
    finally:
        logger.setLevel(before)
        if handler is not None:
            logger.removeHandler(handler)
            handler.close()


__all__ = ["WORKER_LOGLEVEL", "start_worker", "test_worker_started", "test_worker_starting",
           "test_worker_stopped"]
