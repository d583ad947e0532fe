"""Huey's side of the bench: the instance, its tasks (no-op, I/O, sleep), the worker's
ready signal.

The worker is ``huey_consumer huey_app.huey -k process -w 2`` (two worker processes,
like Celery's ``--pool prefork -c 2``) run with ``bench/.venv-huey``'s python and this
directory on ``PYTHONPATH``. Queue and results are Redis database 10
(``BENCH_HUEY_URL``), which the bench empties before each run. Settings are Huey's
defaults (a blocking BRPOP fetch) but one: ``notify_result=True``, so that a caller
waiting for a result blocks on a notification list instead of polling (the issue's
"notify" row). Huey stores no ``None`` (``store_none=False``): that is how the I/O task's
result is ignored, and why the no-op returns 0 (a result stored, as every other
system's no-op stores one).
"""

from __future__ import annotations

import os
import time

import peerlib
from huey import RedisHuey

URL = os.environ.get("BENCH_HUEY_URL", "redis://127.0.0.1:6379/10")
NOOP = "bench.noop"

huey = RedisHuey("bench", url=URL, notify_result=True)
if os.environ.get("BENCH_READY_FD"):
    peerlib.watch_parent()  # in the consumer's main process, before it forks its workers


@huey.on_startup()
def _ready() -> None:
    # Runs in each worker process before its first dequeue: it is consuming.
    peerlib.announce_ready()


@huey.task(name=NOOP)
def noop() -> int:
    return 0


@huey.task(name=peerlib.IO)
def io(key: str) -> None:
    peerlib.io_client().incr(key)


@huey.task(name=peerlib.SLEEP)
def sleep(key: str) -> None:
    time.sleep(peerlib.SLEEP_SECONDS)
    peerlib.io_client().incr(key)
