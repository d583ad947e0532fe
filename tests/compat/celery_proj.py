"""The Celery side of the compatibility tests: a plain Celery 5 app, run in the Celery
virtualenv (``tests/.venv-celery``) as ``celery -A celery_proj worker`` and by
``celery_driver.py``. Its tasks have the names of ``celeriac_proj.py``'s, so either
fleet runs what the other sends; ``compat.who`` tells which one ran a task.

Configured from the environment: ``COMPAT_BROKER``, ``COMPAT_BACKEND``,
``COMPAT_KEYPREFIX`` (``global_keyprefix`` of the broker and the result backend),
``COMPAT_TASK_COMPRESSION``, ``COMPAT_RESULT_COMPRESSION``, ``COMPAT_QUEUES``
(``task_queues``, ``queues_from_env`` below)."""

import json
import os
import time

from celery import Celery

app = Celery("compat", broker=os.environ["COMPAT_BROKER"],
             backend=os.environ["COMPAT_BACKEND"])
if os.environ.get("COMPAT_KEYPREFIX"):
    app.conf.broker_transport_options = {"global_keyprefix": os.environ["COMPAT_KEYPREFIX"]}
    app.conf.result_backend_transport_options = {
        "global_keyprefix": os.environ["COMPAT_KEYPREFIX"]}
app.conf.update(
    result_extended=os.environ.get("COMPAT_EXTENDED") == "1",
    worker_prefetch_multiplier=int(os.environ.get("COMPAT_PREFETCH", "4")),
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    task_compression=os.environ.get("COMPAT_TASK_COMPRESSION") or None,
    result_compression=os.environ.get("COMPAT_RESULT_COMPRESSION") or None,
)


def queues_from_env():
    """``task_queues`` from ``COMPAT_QUEUES``, a JSON list of ``["broadcast", name]``
    (kombu's ``Broadcast``) and ``["topic", queue, exchange, binding pattern]``."""
    from kombu import Exchange, Queue
    from kombu.common import Broadcast

    return [Broadcast(spec[1]) if spec[0] == "broadcast"
            else Queue(spec[1], Exchange(spec[2], type="topic"), routing_key=spec[3])
            for spec in json.loads(os.environ["COMPAT_QUEUES"])]


if os.environ.get("COMPAT_QUEUES"):
    app.conf.task_queues = queues_from_env()


@app.task(name="compat.add")
def add(x, y):
    return x + y


@app.task(name="compat.mul")
def mul(x, y):
    return x * y


@app.task(name="compat.total")
def total(values):
    return sum(values)


@app.task(name="compat.boom")
def boom(message):
    raise ValueError(message)


@app.task(name="compat.who")
def who(*args):
    return ["celery", *args]


@app.task(name="compat.noop")
def noop(i=None):
    return i


@app.task(name="compat.types")
def types(*args):
    """The type of each argument as this side decoded it, and the arguments back."""
    return [[type(a).__name__ for a in args], list(args)]


@app.task(name="compat.slow_who")
def slow_who(seconds):
    time.sleep(seconds)  # sleep-ok: the task's own work
    return "celery"


@app.task(name="compat.log_error")
def log_error(task_id):
    return f"errback for {task_id}"


@app.task(name="compat.count_total")
def count_total(values, key):
    """A chord body that counts its runs in Redis (``COMPAT_COUNTER`` names the DB)."""
    import redis

    redis.Redis.from_url(os.environ["COMPAT_COUNTER"]).incr(key)
    return sum(values)


@app.task(name="compat.mark")
def mark(key):
    """Appends "celery" to the Redis list ``key`` (``COMPAT_COUNTER`` names the DB): which
    fleets ran a task, and how often."""
    import redis

    redis.Redis.from_url(os.environ["COMPAT_COUNTER"]).rpush(key, "celery")
    return "celery"
