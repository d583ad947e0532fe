"""Tasks for ``test_flow_stores.py``: ``-A tests.integration.flow_stores_tasks``. The
app reads its settings from ``CELERIAC_*``."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from celeriac import Celeriac, Settings

app = Celeriac("flowstores", settings=Settings.from_env())


@app.task(bind=True, concurrency=2)
def capped(self: Any, marker_dir: str, seconds: float) -> str:
    """At most two at once across the cluster (no key); records its start and end."""
    began = time.time()
    time.sleep(seconds)  # sleep-ok: the task's own work
    Path(marker_dir, f"capped-{self.request.id}").write_text(f"{began} {time.time()}")
    return "ok"


@app.task
async def waits(marker_dir: str, seconds: float) -> str:
    """Marks its start, then waits ``seconds``: only a revoke ends it sooner."""
    Path(marker_dir, f"waits-{waits.request.id}").touch()
    await asyncio.sleep(seconds)  # sleep-ok: the task's own wait
    return "done"
