"""Tasks for the fair queue tests on the SQLite broker (``tests/faults/test_flow_fair_sqlite.py``,
``tests/integration/test_flow_fair_sqlite.py``): ``-A tests.faults.sqlite_fair_tasks``.
The app reads its settings from ``CELERIAC_*``; ``FAIR_PLACES_DB`` names a SQLite file
of the test's own where each run takes the next place, so a test sees the order tasks
ran in with no server but SQLite."""

from __future__ import annotations

import os
import sqlite3

from celeriac import Celeriac, Settings

app = Celeriac("fair_sqlite", settings=Settings.from_env())

_places: sqlite3.Connection | None = None


def places_db(path: str) -> None:
    """Make the places file (before a worker starts)."""
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE IF NOT EXISTS places (n INTEGER NOT NULL)")
        conn.execute("INSERT INTO places SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM places)")
    conn.close()


def taken(path: str) -> int:
    """How many places were taken so far."""
    conn = sqlite3.connect(path, timeout=30)
    try:
        return int(conn.execute("SELECT n FROM places").fetchone()[0])
    finally:
        conn.close()


@app.task
def place(key: str) -> int:
    """The next place among this test's tasks, in the order they ran."""
    global _places
    if _places is None:
        _places = sqlite3.connect(os.environ["FAIR_PLACES_DB"], timeout=30,
                                  isolation_level=None)
    return int(_places.execute("UPDATE places SET n = n + 1 RETURNING n").fetchone()[0])
