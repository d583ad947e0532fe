"""Tasks for the flow-control fault tests (``tests/faults/test_flow_*.py``):
``-A tests.faults.flow_tasks``. The app reads its settings from ``CELERIAC_*``.

Each run appends a line to ``<marker_dir>/<pid>-<task id>`` as it starts, so a test sees
where a task ran and how many times.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from celeriac import Celeriac, Settings
from celeriac.contrib.abortable import AbortableTask

app = Celeriac("flow", settings=Settings.from_env())


def mark(marker_dir: str, task_id: str | None) -> None:
    with open(Path(marker_dir, f"{os.getpid()}-{task_id}"), "a") as f:
        f.write("started\n")


@app.task(bind=True, base=AbortableTask)
def patient(self: AbortableTask[Any, Any], marker_dir: str, seconds: float) -> str:
    """Loops until aborted (or ``seconds``): a sync task that looks."""
    mark(marker_dir, self.request.id)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if self.is_aborted():
            return "aborted"
        time.sleep(0.01)  # sleep-ok: the task's own work between looks
    return "done"


@app.task
async def waits(marker_dir: str, seconds: float) -> str:
    """An async task that waits ``seconds``: only a revoke ends it sooner."""
    mark(marker_dir, waits.request.id)
    await asyncio.sleep(seconds)  # sleep-ok: the task's own wait
    return "done"


@app.task
def collect(results: list[Any]) -> list[Any]:
    return results


@app.task(bind=True)
def sleeper(self: Any, marker_dir: str, seconds: float) -> int:
    """Marks its start, sleeps ``seconds``; returns its pid."""
    mark(marker_dir, self.request.id)
    time.sleep(seconds)  # sleep-ok: the task's own work
    return os.getpid()


# -- unique jobs ----------------------------------------------------------------------
@app.task(bind=True, unique_for=30)
def once(self: Any, marker_dir: str, key: str, seconds: float) -> str:
    """Unique by its arguments until it finishes; runs ``seconds``."""
    mark(marker_dir, self.request.id)
    time.sleep(seconds)  # sleep-ok: the task's own work
    return key


@app.task(bind=True, unique_for=30, unique_mode="until_started",
          unique_key=lambda a, k: a[1])
def once_queued(self: Any, marker_dir: str, key: str, seconds: float) -> str:
    """Unique by ``key`` while queued only."""
    mark(marker_dir, self.request.id)
    time.sleep(seconds)  # sleep-ok: the task's own work
    return key


@app.task(bind=True, unique_for=1.0, unique_mode="debounce", unique_key=lambda a, k: a[1])
def debounced(self: Any, marker_dir: str, key: str, value: int) -> int:
    """The last call within 1 s of the one before runs."""
    mark(marker_dir, self.request.id)
    return value


# -- concurrency limits ---------------------------------------------------------------
@app.task(bind=True, concurrency=2, concurrency_key=lambda a, k: a[1])
def per_tenant(self: Any, marker_dir: str, tenant: str, seconds: float) -> str:
    """At most two at once per tenant; records its start and end times."""
    began = time.time()
    time.sleep(seconds)  # sleep-ok: the task's own work
    Path(marker_dir, f"{tenant}-{self.request.id}").write_text(f"{began} {time.time()}")
    return tenant


def most_at_once(marker_dir: str, tenant: str) -> int:
    """The most runs of ``tenant`` that overlapped, from their records."""
    spans = [tuple(map(float, p.read_text().split()))
             for p in Path(marker_dir).iterdir() if p.name.startswith(f"{tenant}-")]
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans],
                   key=lambda x: (x[0], x[1]))
    now = peak = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


@app.task(bind=True, acks_late=True)
def succeeds_then_hangs(self: Any, marker_dir: str) -> str:
    """Stores its own SUCCESS, then hangs: a worker killed now leaves a redelivery of a
    task that succeeded (``worker_deduplicate_successful_tasks``)."""
    app.backend.store(self.request.id, "SUCCESS", "early")
    mark(marker_dir, self.request.id)
    time.sleep(60)  # sleep-ok: the task's own wait, ended by the test's kill -9
    return "late"


# -- fair queues ----------------------------------------------------------------------
_counter: Any = None


@app.task(ignore_result=False)
def fair_work(key: str) -> int:
    """Its place among the tasks of this test, in the order they ran (a Redis counter
    under the broker URL's namespace)."""
    global _counter
    url = app.settings.broker_url
    if _counter is None:
        import redis

        _counter = redis.Redis.from_url(url.partition("?")[0])
    ns = url.partition("namespace=")[2].partition("&")[0]
    for attempt in range(50):  # bounded: a Redis restart (test_flow_fair_restart.py)
        try:
            return int(_counter.incr(f"{ns}:fairpos"))
        except redis_errors() as exc:
            if attempt == 49:
                raise
            last = exc
        time.sleep(0.1)  # sleep-ok: waits out the restart
    raise AssertionError(f"unreachable: {last!r}")


def redis_errors() -> tuple[type[BaseException], ...]:
    import redis

    return (redis.ConnectionError, redis.BusyLoadingError)
