"""``async def`` tasks for ``test_async_revoke.py`` (revoke with terminate of async tasks):
``-A tests.faults.async_revoke_tasks``. The app reads its settings from ``CELERIAC_*``.

Each task appends a line to ``<marker_dir>/<pid>-<task id>`` as it starts, so a test sees
where it runs and how many times it ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

from celeriac import Celeriac, Settings

app = Celeriac("arevoke", settings=Settings.from_env())


def _started(marker_dir: str, task_id: str | None) -> None:
    with open(Path(marker_dir, f"{os.getpid()}-{task_id}"), "a") as f:
        f.write("started\n")


@app.task
async def gated(gate: str, marker_dir: str) -> int:
    """Runs until the test creates ``gate``; returns its process id."""
    _started(marker_dir, gated.request.id)
    deadline = time.monotonic() + 120  # bounded: a test that never opens it fails
    while not Path(gate).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {gate} never opened")
        await asyncio.sleep(0.02)  # sleep-ok: polls the test's gate
    return os.getpid()


@app.task
async def victim(marker_dir: str) -> str:
    """Waits a minute: only a revoke ends it sooner."""
    _started(marker_dir, victim.request.id)
    await asyncio.sleep(60)  # sleep-ok: the task's own wait
    return "not revoked"


@app.task
async def stubborn(marker_dir: str, seconds: float) -> str:
    """Swallows every cancellation for ``seconds``: what the kill grace is for."""
    _started(marker_dir, stubborn.request.id)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        # Ignores the revoke's cancellation, as badly written code does.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.05)  # sleep-ok: the task's own wait
    return "ignored the cancellation"
