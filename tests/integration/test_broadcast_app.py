"""The app the routing tests' workers run (``test_broadcast.py``, ``test_topic.py``,
``test_worker_direct.py``): a ``Broadcast`` queue, a topic exchange with binding
patterns, a plain queue, and ``worker_direct``, declared as Celery's docs write them."""

from __future__ import annotations

import os
import time
from typing import Any

from kombu import Exchange, Queue
from kombu.common import Broadcast

from celeriac import Celeriac, Settings

media = Exchange("media", type="topic")

app = Celeriac("routing_app", settings=Settings.from_env())
app.conf.update(
    worker_direct=True,
    task_queues=(
        Queue("celery"),
        Broadcast("fleet"),
        Queue("images", media, routing_key="*.image.#"),
        Queue("everything", media, routing_key="#"),
    ),
    task_routes={
        "routing_app.reload": {"queue": "fleet", "exchange": "fleet"},
        "routing_app.thumbnail": {"exchange": "media", "routing_key": "eu.image.png"},
    },
)


@app.task(name="routing_app.reload", bind=True)
def reload(self: Any, tag: str) -> str:
    return f"{tag}@{self.request.hostname}"


@app.task(name="routing_app.thumbnail", bind=True)
def thumbnail(self: Any, n: int) -> str:
    return f"{n}@{self.request.hostname}:{self.request.delivery_info.get('queue')}"


@app.task(name="routing_app.where", bind=True)
def where(self: Any) -> str:
    return str(self.request.hostname)


@app.task(name="routing_app.block", bind=True)
def block(self: Any, marker: str) -> str:
    """The first worker to start it (on ``w2``, the second host) blocks until killed;
    any other run returns at once."""
    if self.request.hostname.startswith("w2") and not os.path.exists(marker):
        open(marker, "w").close()
        time.sleep(120)  # sleep-ok: the task the test kills while it runs
        return "blocked"
    return ("again@" if self.request.hostname.startswith("w2") else "w1@") + \
        self.request.hostname
