"""Celery's side of the bench: the app, its tasks (no-op, I/O, chord body), and the
worker's ready signal.

The worker is ``celery -A celery_app worker --pool prefork -c 2 -l warning`` run with
``bench/.venv-celery``'s python and this directory on ``PYTHONPATH``; the driver
(``celery_driver.py``) makes its own apps with ``make_app()``. Broker and results are
Redis database 14 (``BENCH_CELERY_URL``), which the bench empties before each run.
Settings are Celery's defaults (prefetch multiplier 4, acks on receipt, JSON).
"""

from __future__ import annotations

import os
import time
from typing import Any

import peerlib
from celery import Celery, signals

URL = os.environ.get("BENCH_CELERY_URL", "redis://127.0.0.1:6379/14")
NOOP = "bench.noop"
COLLECT = "bench.collect"
"""The chord row's body: the list of the header's results in, its length out."""


def make_app(url: str = URL) -> tuple[Any, Any]:
    app = Celery("bench", broker=url, backend=url)
    app.conf.broker_connection_retry_on_startup = True  # silences a startup warning

    @app.task(name=NOOP)
    def noop() -> None:
        return None

    @app.task(name=peerlib.IO, ignore_result=True)
    def io(key: str) -> None:
        peerlib.io_client().incr(key)

    @app.task(name=peerlib.SLEEP, ignore_result=True)
    def sleep(key: str) -> None:
        time.sleep(peerlib.SLEEP_SECONDS)
        peerlib.io_client().incr(key)

    @app.task(name=COLLECT)
    def collect(results: list[Any]) -> int:
        return len(results)

    return app, noop


app, noop = make_app()


@signals.worker_ready.connect
def _ready(sender: Any = None, **kwargs: Any) -> None:
    # Sent by the consumer just before it enters its event loop: it is consuming.
    peerlib.announce_ready()


@signals.worker_init.connect
def _init(sender: Any = None, **kwargs: Any) -> None:
    peerlib.watch_parent()
