"""``async def`` tasks for the worker tests (``test_async_worker.py``), on the app of
``app_tasks`` (whose sync tasks they mix with): ``-A tests.integration.async_app_tasks``."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from celeriac import SoftTimeLimitExceeded
from tests.integration.app_tasks import add, app

__all__ = ["add", "app"]


@app.task
async def adouble(x: int) -> int:
    await asyncio.sleep(0.01)  # sleep-ok: the task's own wait
    return x * 2


@app.task
async def anap(seconds: float, marker_dir: str | None = None) -> int:
    if marker_dir:
        Path(marker_dir, f"{os.getpid()}-{anap.request.id}").touch()
    await asyncio.sleep(seconds)  # sleep-ok: the task's own wait
    return os.getpid()


@app.task(bind=True, max_retries=3)
async def aflaky(self, n: int) -> list[int]:  # type: ignore[no-untyped-def]
    if self.request.retries < 2:
        raise self.retry(countdown=0.1)
    return [n, self.request.retries]


@app.task
async def ablock(seconds: float) -> str:
    time.sleep(seconds)  # sleep-ok: blocking code in a coroutine, what the watch reports
    return "blocked"


@app.task(soft_time_limit=0.3)
async def asoft() -> str:
    try:
        await asyncio.sleep(10)  # sleep-ok: the task's own wait
    except SoftTimeLimitExceeded:
        return "cleaned up"
    return "not interrupted"


@app.task(soft_time_limit=0.3)
def soft_thread() -> str:
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # Python code: the exception lands here
            pass
    except SoftTimeLimitExceeded:
        return "cleaned up"
    return "not interrupted"
