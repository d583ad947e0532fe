"""Tasks for ``test_unique_followups.py``: ``-A tests.integration.unique_followups_tasks``.
The app reads its settings from ``CELERIAC_*``.

Each run of a unique task appends a line to ``<marker_dir>/<task id>`` as it starts, so a
test sees which ids ran, then waits until the test opens the gate (the file
``<marker_dir>/go``; at most ``seconds``); it returns ``<key>:<its own id>``, so a caller
sees whose result it got.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from celeriac import Celeriac, Settings

app = Celeriac("uniqf", settings=Settings.from_env())


GATE = "go"


def _run(marker_dir: str, task_id: str | None, key: str, seconds: float) -> str:
    with open(Path(marker_dir, str(task_id)), "a") as f:
        f.write("started\n")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not Path(marker_dir, GATE).exists():
        time.sleep(0.02)  # sleep-ok: the task's own work, until the test lets it end
    return f"{key}:{task_id}"


@app.task(bind=True, unique_for=30, unique_key=lambda a, k: a[1])
def once(self: Any, marker_dir: str, key: str, seconds: float, fail: bool = False) -> str:
    """Unique by ``key`` until it finishes; raises ``ValueError`` with ``fail``."""
    value = _run(marker_dir, self.request.id, key, seconds)
    if fail:
        raise ValueError(f"{key} failed")
    return value


@app.task(bind=True, unique_for=30, unique_key=lambda a, k: a[1], ignore_result=True)
def quiet(self: Any, marker_dir: str, key: str, seconds: float) -> str:
    """``once`` that stores no result: a job waiting for it never gets one."""
    return _run(marker_dir, self.request.id, key, seconds)


@app.task
def first(value: Any = None) -> str:
    return "first"


@app.task
def collect(value: Any) -> Any:
    return value
