"""Tasks for the fair queue tests on the SQLite broker (``tests/faults/test_flow_fair_sqlite.py``,
``tests/integration/test_flow_fair_sqlite.py``): ``-A tests.faults.sqlite_fair_tasks``.
The app reads its settings from ``CELERIAC_*``; ``FAIR_PLACES_DB`` names a file of the
test's own where each run takes the next place, so a test sees the order tasks ran in with
no server but SQLite.

A place is one byte appended to that file (``O_APPEND``: the kernel orders concurrent
appends, and the offset after the write is this run's place). A counter in a SQLite table
measured the lock instead: two children updating it collided, and SQLite's busy handler
slept 1, 2, 5, 10... ms before it tried again, so a task that ran in turn took a place
hundreds further on (B's tasks at places 5 to 644 where they ran by 201)."""

from __future__ import annotations

import os

from celeriac import Celeriac, Settings

app = Celeriac("fair_sqlite", settings=Settings.from_env())

_places: int | None = None


def places_db(path: str) -> None:
    """Make the places file (before a worker starts)."""
    with open(path, "wb"):
        pass


def taken(path: str) -> int:
    """How many places were taken so far."""
    return os.stat(path).st_size


@app.task
def place(key: str) -> int:
    """The next place among this test's tasks, in the order they ran."""
    global _places
    if _places is None:
        _places = os.open(os.environ["FAIR_PLACES_DB"], os.O_WRONLY | os.O_APPEND)
    os.write(_places, b".")
    return os.lseek(_places, 0, os.SEEK_CUR)
