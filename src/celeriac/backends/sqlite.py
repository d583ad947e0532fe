"""Results in a SQLite file (the embedded default, usually the broker's own file).

Schema::

    results(seq INTEGER PRIMARY KEY AUTOINCREMENT, task_id TEXT UNIQUE, content_type,
            data BLOB, expires REAL)

``expires`` is unix time (NULL: never). Readers ignore expired rows; ``cleanup`` deletes
them (the worker calls it on its Timer). Every write replaces the row and so takes a new,
never reused ``seq``: ``wait_for`` reads only rows with ``seq`` past its cursor. Writers
ring the ``results`` doorbell, so ``AsyncResult.get()`` sleeps until a result is written
instead of polling.

Chords (``chord_part``)::

    chord_parts(group_id TEXT, task_id TEXT, PRIMARY KEY (group_id, task_id))
    chords(group_id TEXT PRIMARY KEY, fired_by TEXT, expires REAL)

A chord's parts and its row go together: ``chord_part`` writes both in one transaction,
and an expired chord (its row's ``expires`` passed) is deleted with its parts, by the next
``chord_part`` on it (which starts over) or by ``cleanup``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..clients.sqlite import Database, Doorbell, Listener, path_from_url
from .base import ResultBackend, Stored

if TYPE_CHECKING:
    from ..settings import Settings

SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL UNIQUE,
    content_type TEXT NOT NULL,
    data BLOB NOT NULL,
    expires REAL
);
CREATE INDEX IF NOT EXISTS results_expires ON results (expires) WHERE expires IS NOT NULL;
CREATE TABLE IF NOT EXISTS chord_parts (
    group_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    PRIMARY KEY (group_id, task_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS chords (
    group_id TEXT PRIMARY KEY,
    fired_by TEXT,
    expires REAL
);
CREATE INDEX IF NOT EXISTS chords_expires ON chords (expires) WHERE expires IS NOT NULL
"""


class SQLiteBackend(ResultBackend):
    scheme = "sqlite"
    network = False

    def __init__(self, url: str, settings: Settings) -> None:
        super().__init__(url, settings)
        self.path = path_from_url(url)
        self.db = Database(self.path, SCHEMA, role="results")
        self.bell = Doorbell(self.path, "results")
        self._local = threading.local()
        self._listeners: list[Listener] = []

    def _listener(self) -> Listener:
        # One per thread (and process): a thread's read drains only its own rings, so it
        # can never swallow the ring another thread is about to sleep on.
        listener: Listener | None = getattr(self._local, "listener", None)
        if listener is None or self._local.pid != os.getpid():
            listener = self.bell.listen()
            self._local.listener, self._local.pid = listener, os.getpid()
            self._listeners.append(listener)
        return listener

    def store_many(self, items: Sequence[Stored]) -> None:
        if not items:
            return
        # One transaction and one ring for the batch.
        with self.db.transaction() as conn:
            conn.executemany(
                "INSERT OR REPLACE INTO results (task_id, content_type, data, expires)"
                " VALUES (?, ?, ?, ?)", items,
            )
        self.bell.ring()

    def _get(self, task_ids: Sequence[str]) -> dict[str, tuple[str, bytes]]:
        # Listen (and drain) before reading, so a result written between this read and
        # the following _wait still rings us.
        self._listener().drain()
        marks = ",".join("?" * len(task_ids))
        rows = self.db.read(
            f"SELECT task_id, content_type, data FROM results WHERE task_id IN ({marks})"
            " AND (expires IS NULL OR expires > ?)", (*task_ids, time.time()),
        )
        return {tid: (ct, data) for tid, ct, data in rows}

    def _cursor(self) -> int:
        self._listener().drain()
        return int(self.db.read("SELECT coalesce(max(seq), 0) FROM results")[0][0])

    def _changes(self, cursor: int) -> tuple[int, list[str]]:
        self._listener().drain()
        rows = self.db.read("SELECT seq, task_id FROM results WHERE seq > ? ORDER BY seq",
                            (cursor,))
        return (rows[-1][0] if rows else cursor), [r[1] for r in rows]

    def _wait(self, timeout: float) -> None:
        self._listener().wait(timeout)

    def forget(self, task_id: str) -> None:
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM results WHERE task_id = ?", (task_id,))

    def chord_part(self, group_id: str, task_id: str, size: int) -> bool:
        now = time.time()
        expires = self.settings.result_expires
        expires_at = now + expires if expires else None
        # BEGIN IMMEDIATE takes the database's write lock before the first read, so the
        # count below cannot miss a part another connection (or process) is adding: the
        # callers run one after the other, and only one sees the count reach ``size``
        # while the flag is still clear.
        with self.db.transaction() as conn:
            gone = conn.execute("DELETE FROM chords WHERE group_id = ? AND expires <= ?",
                                (group_id, now)).rowcount
            if gone:  # expired (cleanup has not run yet): this count starts over
                conn.execute("DELETE FROM chord_parts WHERE group_id = ?", (group_id,))
            conn.execute("INSERT OR IGNORE INTO chord_parts (group_id, task_id) VALUES (?, ?)",
                         (group_id, task_id))
            conn.execute(
                "INSERT INTO chords (group_id, fired_by, expires) VALUES (?, NULL, ?)"
                " ON CONFLICT (group_id) DO UPDATE SET expires = excluded.expires",
                (group_id, expires_at))
            # The rowcount of this conditional update is the answer: it changes the row
            # only for the one call that both sees the count at ``size`` and the flag clear.
            if conn.execute(
                    "UPDATE chords SET fired_by = ? WHERE group_id = ? AND fired_by IS NULL"
                    " AND (SELECT count(*) FROM chord_parts WHERE group_id = ?) >= ?",
                    (task_id, group_id, group_id, size)).rowcount == 1:
                return True
            # The completing task, run again (its first run may have died before it sent
            # the body): it is told to fire again.
            row = conn.execute("SELECT fired_by FROM chords WHERE group_id = ?",
                               (group_id,)).fetchone()
            return bool(row) and row[0] == task_id

    def cleanup(self) -> int:
        now = time.time()
        with self.db.transaction() as conn:
            # Chord rows and their parts in the same transaction: a chord never loses its
            # row while keeping its parts (chord_part would then count on stale parts).
            conn.execute(
                "DELETE FROM chord_parts WHERE group_id IN (SELECT group_id FROM chords"
                " WHERE expires IS NOT NULL AND expires <= ?)", (now,))
            conn.execute("DELETE FROM chords WHERE expires IS NOT NULL AND expires <= ?",
                         (now,))
            return conn.execute(
                "DELETE FROM results WHERE expires IS NOT NULL AND expires <= ?", (now,)
            ).rowcount

    def close(self) -> None:
        for listener in self._listeners:
            if listener.pid == os.getpid():
                listener.close()
        self._listeners.clear()
        self._local = threading.local()
        self.bell.close()
        self.db.close()
