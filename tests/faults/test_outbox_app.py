"""The app the outbox tests run in real processes (workers, relays, producers): settings
from ``CELERIAC_*`` variables, and ``record``, which writes one ledger row per run of a
task id to ``OUTBOX_LEDGER_URL`` (PostgreSQL), so a test counts runs per task id.

No tests here (pytest collects the module and finds none): the ``-A`` module of
``celeriac outbox relay`` and ``worker`` in tests/integration/test_outbox.py and
tests/faults/test_outbox_faults.py.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import psycopg

from celeriac import Celeriac, Settings

app = Celeriac("outbox_tests", settings=Settings.from_env(), set_as_current=False)
_local = threading.local()

LEDGER = "CREATE TABLE IF NOT EXISTS ledger (task_id text NOT NULL, pid int NOT NULL)"


def _ledger() -> psycopg.Connection[Any]:
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed or getattr(_local, "pid", None) != os.getpid():
        conn = psycopg.connect(os.environ["OUTBOX_LEDGER_URL"], autocommit=True)
        _local.conn, _local.pid = conn, os.getpid()
    return conn


@app.task(bind=True, name="outbox.record", acks_late=True)
def record(self: Any, n: int) -> int:
    _ledger().execute("INSERT INTO ledger (task_id, pid) VALUES (%s, %s)",
                      (self.request.id, os.getpid()))
    return n
