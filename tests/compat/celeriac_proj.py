"""The celeriac side of the compatibility tests: the tasks of ``celery_proj.py``, under
the same names, in a celeriac app. Configured from the environment: ``COMPAT_BROKER``,
``COMPAT_BACKEND`` (celeriac's compatibility URLs: ``?layout=kombu``, ``?layout=celery``,
``db+postgresql://``), ``COMPAT_KEYPREFIX`` (kombu's and Celery's ``global_keyprefix``),
``COMPAT_TASK_COMPRESSION``, ``COMPAT_RESULT_COMPRESSION``, ``COMPAT_QUEUES``
(``task_queues`` as kombu objects, as ``celery_proj.queues_from_env`` makes them)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celeriac import Celeriac

_PREFIX = {"global_keyprefix": os.environ["COMPAT_KEYPREFIX"]} \
    if os.environ.get("COMPAT_KEYPREFIX") else {}


def queues_from_env() -> list[Any]:
    """``task_queues`` from ``COMPAT_QUEUES``: ``["broadcast", name]`` (kombu's
    ``Broadcast``), ``["topic", queue, exchange, binding pattern]``; none without it."""
    if not os.environ.get("COMPAT_QUEUES"):
        return []
    from kombu import Exchange, Queue
    from kombu.common import Broadcast

    return [Broadcast(spec[1]) if spec[0] == "broadcast"
            else Queue(spec[1], Exchange(spec[2], type="topic"), routing_key=spec[3])
            for spec in json.loads(os.environ["COMPAT_QUEUES"])]


app = Celeriac("compat", broker=os.environ["COMPAT_BROKER"],
               backend=os.environ["COMPAT_BACKEND"],
               result_extended=os.environ.get("COMPAT_EXTENDED") == "1",
               worker_prefetch_multiplier=int(os.environ.get("COMPAT_PREFETCH", "4")),
               broker_transport_options=_PREFIX, result_backend_transport_options=_PREFIX,
               task_compression=os.environ.get("COMPAT_TASK_COMPRESSION") or None,
               result_compression=os.environ.get("COMPAT_RESULT_COMPRESSION") or None,
               task_queues=queues_from_env() or None)


@app.task(name="compat.add")
def add(x: int, y: int) -> int:
    return x + y


@app.task(name="compat.mul")
def mul(x: int, y: int) -> int:
    return x * y


@app.task(name="compat.total")
def total(values: list[int]) -> int:
    return sum(values)


@app.task(name="compat.boom")
def boom(message: str) -> None:
    raise ValueError(message)


@app.task(name="compat.who")
def who(*args: Any) -> list[Any]:
    return ["celeriac", *args]


@app.task(name="compat.noop")
def noop(i: int | None = None) -> int | None:
    return i


@app.task(name="compat.types")
def types(*args: Any) -> list[Any]:
    """The type of each argument as this side decoded it, and the arguments back."""
    return [[type(a).__name__ for a in args], list(args)]


@app.task(name="compat.slow_who")
def slow_who(seconds: float) -> str:
    time.sleep(seconds)  # sleep-ok: the task's own work
    return "celeriac"


@app.task(name="compat.log_error")
def log_error(task_id: str) -> str:
    return f"errback for {task_id}"


@app.task(name="compat.count_total")
def count_total(values: list[int], key: str) -> int:
    """A chord body that counts its runs in Redis (``COMPAT_COUNTER`` names the DB)."""
    import redis

    redis.Redis.from_url(os.environ["COMPAT_COUNTER"]).incr(key)
    return sum(values)


@app.task(name="compat.mark")
def mark(key: str) -> str:
    """Appends "celeriac" to the Redis list ``key`` (``COMPAT_COUNTER`` names the DB):
    which fleets ran a task, and how often."""
    import redis

    redis.Redis.from_url(os.environ["COMPAT_COUNTER"]).rpush(key, "celeriac")
    return "celeriac"
