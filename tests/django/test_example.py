"""The example Django project (``examples/django``) end to end: its own PostgreSQL
database (made and dropped here) with every table made by Django's migrations (the
admin's, django-celery-results', django-celery-beat's, the shop's), a real
``celeriac -A proj worker -B`` and a second ``celeriac -A proj beat``, in the Celery docs'
layout.

- A view saves an order and sends its task with ``delay_on_commit``: the worker finds the
  row; a rolled-back order sends nothing. Results land in django-celery-results' table
  (``django-db``) and read back through ``AsyncResult``.
- A periodic task created as the admin creates it runs; edited, the change takes effect
  within ``beat_max_loop_interval``; with two beats each due time runs once; a one-off
  clocked task runs once and is disabled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celeriac.testing import WorkerProcess, wait_until
from tests.contracts.conftest import _drop_redis_namespace
from tests.services import require

ROOT = Path(__file__).resolve().parent.parent.parent
PROJECT = ROOT / "examples" / "django"
MAX_LOOP = 1.0
"""The example's ``beat_max_loop_interval`` here: an admin edit shows within it."""
pytestmark = pytest.mark.slow


class Example:
    """The project's environment for this test: database, broker namespace, processes."""

    def __init__(self, database: str, broker: str) -> None:
        self.database = database
        self.dsn = f"{require('postgres').rsplit('/', 1)[0]}/{database}"
        self.env = {"EXAMPLE_DB_NAME": database, "EXAMPLE_BROKER_URL": broker,
                    "EXAMPLE_BEAT_MAX_LOOP_INTERVAL": str(MAX_LOOP),
                    "DJANGO_SETTINGS_MODULE": "proj.settings",
                    "PYTHONPATH": os.pathsep.join([str(PROJECT), str(ROOT)])}

    def run(self, *argv: str, timeout: float = 60.0) -> str:
        done = subprocess.run([sys.executable, *argv], cwd=PROJECT, capture_output=True,
                              env={**os.environ, **self.env}, timeout=timeout, check=False)
        assert done.returncode == 0, done.stderr.decode()[-3000:]
        return done.stdout.decode()

    def client(self, *argv: str) -> list[Any]:
        """``example_client.py``'s answers, one per command (``--`` between them)."""
        out = self.run(str(ROOT / "tests" / "django" / "example_client.py"), *argv)
        answers: list[Any] = json.loads(out.strip().splitlines()[-1])
        return answers

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return conn.execute(sql, params).fetchall()


@pytest.fixture(scope="module")
def example() -> Iterator[Example]:
    import psycopg

    server = require("postgres").rsplit("/", 1)[0]
    broker = f"{require('redis')}?namespace=dj{uuid.uuid4().hex[:10]}"
    database = f"celeriac_example_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    ex = Example(database, broker)
    try:
        ex.run("manage.py", "migrate", "-v", "0", timeout=90)
        yield ex
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        _drop_redis_namespace(broker)


@pytest.fixture(scope="module")
def worker(example: Example) -> Iterator[WorkerProcess]:
    """One worker with an embedded beat, and a second beat process beside it."""
    w = WorkerProcess("proj", "-B", "-c", "2", env=example.env, cwd=str(PROJECT))
    beat = subprocess.Popen(
        [sys.executable, "-m", "celeriac", "-A", "proj", "beat", "-l", "info",
         "-S", "django_celery_beat.schedulers:DatabaseScheduler"],  # as its docs start it
        cwd=PROJECT, env={**os.environ, **example.env}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        yield w.start(ready_timeout=60)
    finally:
        beat.terminate()
        beat.wait(15)
        w.stop()


def test_orders_are_processed_on_commit_and_results_land_in_django_tables(
        example: Example, worker: WorkerProcess) -> None:
    placed, refused, read = example.client("order", "book", "--", "order", "pen", "fail",
                                           "--", "result", "shop.tasks.process_order")
    assert placed["status"] == 201
    assert refused["status"] == 402
    assert read["state"] == "SUCCESS" and read["result"] == "processed book"

    order_id = placed["body"]["order"]
    assert example.query(
        "SELECT 1 FROM shop_order WHERE id = %s AND processed_at IS NOT NULL", order_id)
    rows = example.query(
        "SELECT task_id, status, result, task_name, worker FROM "
        "django_celery_results_taskresult WHERE task_name = 'shop.tasks.process_order'")
    assert len(rows) == 1, f"one order committed, one rolled back: {rows}"
    task_id, status, result, _, host = rows[0]
    assert (status, json.loads(result)) == ("SUCCESS", "processed book")
    assert host, "result_extended records the worker"
    assert task_id == read["task_id"]
    assert example.query("SELECT count(*) FROM shop_order")[0][0] == 1  # pen rolled back


def test_admin_schedules_run_once_per_due_time_and_edits_take_effect(
        example: Example, worker: WorkerProcess) -> None:
    example.client("schedule", "every-second", "first", "1")

    def ticks(label: str) -> int:
        return int(example.query("SELECT count(*) FROM shop_tick WHERE label = %s",
                                 label)[0][0])

    wait_until(lambda: ticks("first") >= 2, 30, 0.05, message="the periodic task ran")
    example.client("edit", "every-second", "second", "--", "once", "one-off", "clocked", "1")
    # The edit is read at the leader's next tick (within MAX_LOOP), then runs at the next
    # due time (1 s): far inside this bound on a loaded machine too.
    wait_until(lambda: ticks("second") >= 2, 15, 0.05, message="the edit took effect")
    wait_until(lambda: ticks("clocked") >= 1, 15, 0.05, message="the clocked task ran")

    # Each due time ran once: a run key's task id is fixed (uuid5), so a second send of
    # one would leave two ticks for one result row, for good. (A tick's result is stored
    # just after the tick: between two runs, the counts meet.)
    def counts() -> tuple[int, int]:
        return (int(example.query("SELECT count(*) FROM shop_tick")[0][0]),
                int(example.query("SELECT count(*) FROM django_celery_results_taskresult "
                                  "WHERE task_name = 'shop.tasks.tick'")[0][0]))

    wait_until(lambda: len(set(counts())) == 1, 15, 0.05,
               message="as many results as ticks (no due time sent twice)")

    def admin_view(name: str) -> tuple[Any, ...]:
        return example.query("SELECT enabled, total_run_count, last_run_at FROM "
                             "django_celery_beat_periodictask WHERE name = %s", name)[0]

    wait_until(lambda: admin_view("every-second")[1] >= 4, 15, 0.05,
               message="the admin shows the runs")
    assert admin_view("every-second")[2] is not None
    wait_until(lambda: admin_view("one-off")[:2] == (False, 1), 15, 0.05,
               message="a one-off task is disabled after its run")
    assert ticks("clocked") == 1
