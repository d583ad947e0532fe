"""A Celery project's queue declarations, as Celery's docs write them: kombu ``Queue``
objects in ``task_queues`` (one bound to a direct exchange by its own routing key), and a
route by exchange and routing key (``test_task_queues.py``)."""

from __future__ import annotations

from kombu import Exchange, Queue

from celeriac import Celeriac, Settings

app = Celeriac("queues_app", settings=Settings.from_env())
app.conf.update(
    task_default_queue="default",
    task_default_exchange="default",
    task_default_routing_key="default",
    task_queues=(
        Queue("default", Exchange("default"), routing_key="default"),
        Queue("media", Exchange("media"), routing_key="media.video",
              queue_arguments={"x-max-priority": 10}),
    ),
    task_routes={"queues_app.encode": {"exchange": "media", "routing_key": "media.video"}},
)


@app.task(name="queues_app.encode")
def encode(n: int) -> int:
    return n * 2


@app.task(name="queues_app.ping")
def ping() -> str:
    return "pong"
