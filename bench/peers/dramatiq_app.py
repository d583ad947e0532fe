"""Dramatiq's side of the bench: the broker, the no-op actor, the worker's ready signal.

The worker is ``dramatiq dramatiq_app -p 2 -t 1`` (two processes of one worker thread,
like Celery's ``--pool prefork -c 2``) run with ``bench/.venv-dramatiq``'s python and
this directory on ``PYTHONPATH``. Broker and results (the ``Results`` middleware with
its Redis backend) are Redis database 13 (``BENCH_DRAMATIQ_URL``), which the bench
empties before each run. Settings are Dramatiq's defaults otherwise.
"""

from __future__ import annotations

import os
import time
from typing import Any

import dramatiq
import peerlib
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

URL = os.environ.get("BENCH_DRAMATIQ_URL", "redis://127.0.0.1:6379/13")
NOOP = "bench.noop"


class Ready(Middleware):
    """Each worker process reports once it has started consuming."""

    def after_worker_boot(self, broker: Any, worker: Any) -> None:
        peerlib.announce_ready()


broker = RedisBroker(url=URL)
backend = RedisBackend(url=URL)
broker.add_middleware(Results(backend=backend))
if os.environ.get("BENCH_READY_FD"):
    broker.add_middleware(Ready())
    peerlib.watch_parent()
dramatiq.set_broker(broker)


@dramatiq.actor(actor_name=NOOP, store_results=True)
def noop() -> None:
    return None


@dramatiq.actor(actor_name=peerlib.IO, store_results=False)
def io(key: str) -> None:
    peerlib.io_client().incr(key)


@dramatiq.actor(actor_name=peerlib.SLEEP, store_results=False)
def sleep(key: str) -> None:
    time.sleep(peerlib.SLEEP_SECONDS)
    peerlib.io_client().incr(key)
