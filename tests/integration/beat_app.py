"""The app of the beat integration tests: settings from ``CELERIAC_*`` variables, a
1-second interval entry and an every-minute crontab entry; ``beat.record`` appends its
task id to the file named by ``BEAT_RECORD`` (for ``worker -B``)."""

from __future__ import annotations

import os
from typing import Any

from celeriac import Celeriac, Settings
from celeriac.schedules import crontab

entries: dict[str, Any] = {
    "tick": {"task": "beat.record", "schedule": 1.0, "args": ("tick",)},
    "minute": {"task": "beat.record", "schedule": crontab(), "args": ("minute",)},
}
if os.environ.get("BEAT_ENTRIES") == "none":
    entries = {}

app = Celeriac("beat_app", settings=Settings.from_env(), beat_schedule=entries)


@app.task(name="beat.record", bind=True)
def record(self: Any, label: str) -> str:
    path = os.environ.get("BEAT_RECORD")
    if path:
        with open(path, "a") as f:
            f.write(f"{label} {self.request.id}\n")
    return label
