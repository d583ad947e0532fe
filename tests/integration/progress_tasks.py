"""The task test_progress_events runs in a real worker: it reports progress with
``update_state``, spaced and then in a tight loop. Settings come from CELERIAC_*."""

from __future__ import annotations

import time
from typing import Any

from celeriac import Celeriac, Settings
from celeriac.runtime.progress import RUNNING

app = Celeriac("progress", settings=Settings.from_env())


@app.task(bind=True)
def steps(self: Any, spaced: int, gap: float, burst: int) -> dict[str, Any]:
    """``spaced`` reports ``gap`` seconds apart, then ``burst`` at once; returns whether
    this executor registered the task for progress events (only with task events on),
    and how long the burst took (a loaded machine stretches it over more intervals)."""
    for i in range(1, spaced + 1):
        self.update_state(state="PROGRESS", meta={"done": i, "total": spaced})
        time.sleep(gap)  # sleep-ok: the task's own pace, longer than the throttle's interval
    began = time.monotonic()
    for i in range(1, burst + 1):
        self.update_state(state="CRUNCHING", meta={"current": i, "total": burst})
    return {"registered": self.request.id in RUNNING, "burst_s": time.monotonic() - began}


@app.task(bind=True)
async def asteps(self: Any, spaced: int, gap: float, burst: int) -> dict[str, Any]:
    """``steps`` as an ``async def`` task (it waits with ``await``)."""
    import asyncio

    for i in range(1, spaced + 1):
        self.update_state(state="PROGRESS", meta={"done": i, "total": spaced})
        await asyncio.sleep(gap)  # sleep-ok: the task's own wait
    began = time.monotonic()
    for i in range(1, burst + 1):
        self.update_state(state="CRUNCHING", meta={"current": i, "total": burst})
    return {"registered": self.request.id in RUNNING, "burst_s": time.monotonic() - began}
