"""The transactional outbox's cost: ``delay()`` inside ``app.transaction(conn)`` against a
plain ``delay()`` (``bench/run.py --outbox``, or ``python bench/outbox.py``).

celeriac on the bench's Redis database (15) and a PostgreSQL database of its own on
127.0.0.1:5432 (made and dropped here), in this process. Per run, ``--n`` times each:

- ``plain delay()``: ``noop.delay()``, one Redis round trip per call;
- ``transaction writing a row``: ``with conn.transaction():`` one INSERT into a table
  of the bench's (what a request that enqueues in a transaction already pays: its own
  write and the commit's WAL flush);
- ``the same + 1 delay()``: that transaction as ``with app.transaction(conn):`` with one
  ``noop.delay()`` in it (the common shape: a request that writes and enqueues a task);
  its excess over the row above is the outbox's cost;
- ``100 delay() per transaction``: per message, in blocks of 100 (and the INSERT);
- ``relay``: the rows of the last two rows drained to Redis (``Relay.drain_once``,
  batches of 500), per message.

Microseconds per call (per message for the block and the relay), medians of the runs;
the first three rows are called in turn, so that a drifting load weighs on them alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg
import tasks as bench_tasks
from harness import (
    CELERIAC_REDIS_DB,
    CELERIAC_REDIS_URL,
    BenchError,
    console,
    flush_redis_db,
    machine_lock,
    require_redis,
)
from rich.table import Table

from celeriac.producer.outbox_relay import Relay

SERVER = "postgresql://postgres@127.0.0.1:5432"
ROWS = ("plain delay()", "transaction writing a row", "the same + 1 delay()",
        "100 delay() per transaction", "relay")


def _timed(n: int, call: Callable[[], object], per: int = 1) -> float:
    """Microseconds per message of ``n`` calls of ``call`` (each sending ``per``)."""
    began = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - began) / (n * per) * 1e6


def _interleaved(n: int, calls: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Microseconds per call of each, called in turn ``n`` times: a machine whose load
    drifts during the run weighs on every row alike."""
    spent = dict.fromkeys(calls, 0.0)
    clock = time.perf_counter
    for _ in range(n):
        for name, call in calls.items():
            began = clock()
            call()
            spent[name] += clock() - began
    return {name: total / n * 1e6 for name, total in spent.items()}


def one_run(n: int, database: str) -> dict[str, float]:
    app, noop = bench_tasks.make_app(CELERIAC_REDIS_URL)
    app.configure(outbox_url=database)
    figures: dict[str, float] = {}
    try:
        with psycopg.connect(database) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS bench_orders (id serial PRIMARY KEY, "
                         "total int)")
            with app.transaction(conn):  # creates the table, warms the connection
                noop.delay()
            for _ in range(50):
                noop.delay()
            insert = "INSERT INTO bench_orders (total) VALUES (1)"

            def write() -> None:
                with conn.transaction():
                    conn.execute(insert)

            def write_and_send() -> None:
                with app.transaction(conn):
                    conn.execute(insert)
                    noop.delay()

            def hundred() -> None:
                with app.transaction(conn):
                    conn.execute(insert)
                    for _ in range(100):
                        noop.delay()

            figures.update(_interleaved(n, {"plain delay()": noop.delay,
                                            "transaction writing a row": write,
                                            "the same + 1 delay()": write_and_send}))
            figures["100 delay() per transaction"] = _timed(max(n // 100, 1), hundred, 100)
        relay = Relay(app, batch=500)
        try:
            began, moved = time.perf_counter(), 0
            while (step := relay.drain_once()) > 0:
                moved += step
            figures["relay"] = (time.perf_counter() - began) / max(moved, 1) * 1e6
        finally:
            relay.close()
    finally:
        app.close()
        flush_redis_db(CELERIAC_REDIS_DB)
    return figures


def measure(n: int = 2000, runs: int = 3) -> dict[str, float]:
    """Medians over ``runs`` of each row's microseconds per message."""
    require_redis()
    name = f"celeriac_bench_outbox_{uuid.uuid4().hex[:8]}"
    try:
        with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        raise BenchError(f"PostgreSQL is not reachable on 127.0.0.1:5432: {exc}") from None
    try:
        samples = [one_run(n, f"{SERVER}/{name}") for _ in range(runs)]
    finally:
        with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return {row: statistics.median(s[row] for s in samples) for row in ROWS}


def measure_if(wanted: bool, n: int, runs: int) -> dict[str, float] | None:
    """``bench/run.py --outbox``'s figures (at most 2,000 calls x 3 runs), else None."""
    return measure(min(n, 2000), min(runs, 3)) if wanted else None


def show(figures: dict[str, float] | None) -> None:
    if figures is not None:
        console.print(table(figures))


def table(figures: dict[str, float]) -> Table:
    plain = figures["plain delay()"]
    t = Table(title="outbox: delay() inside app.transaction(conn) against a plain delay() "
                    "(us per message, median)", title_justify="left")
    t.add_column("")
    t.add_column("us", justify="right")
    t.add_column("x plain delay()", justify="right")
    for row in ROWS:
        t.add_row(row, f"{figures[row]:.0f}", f"{figures[row] / plain:.2f}")
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2000, help="calls per row (default 2000)")
    parser.add_argument("--runs", type=int, default=3, help="runs (default 3)")
    opts = parser.parse_args(argv)
    if opts.n < 1 or opts.runs < 1:
        parser.error("--n and --runs must be >= 1")
    try:
        with machine_lock(600):
            figures = measure(opts.n, opts.runs)
    except BenchError as exc:
        console.print(f"[red]{exc}[/]")
        return 1
    console.print(table(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
