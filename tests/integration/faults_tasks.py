"""Tasks for tests/integration/test_sqlite_faults.py, run by real worker processes; the
app reads its settings from CELERIAC_* variables."""

from __future__ import annotations

from typing import Any

from celeriac import Celeriac, Settings

app = Celeriac("faults", settings=Settings.from_env())


@app.task
def add(x: int, y: int) -> int:
    return x + y


@app.task
def nested(levels: int) -> Any:
    """A list ``levels`` deep: ``nested(3)`` is ``[[[]]]``."""
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value
