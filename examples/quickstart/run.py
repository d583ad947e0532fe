"""The quickstart demo: a worker on the embedded SQLite broker runs 10,000 tasks.

Starts ``celeriac -A tasks worker`` as a subprocess, sends the tasks with a progress
bar, gathers every result, prints a summary, stops the worker with SIGTERM, and exits
non-zero if a result is missing or wrong.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=10_000, help="tasks to send")
    parser.add_argument("--flaky", type=int, default=20, help="of which retry twice")
    parser.add_argument("--timeout", type=float, default=180.0)
    opts = parser.parse_args()
    console = Console()
    workdir = Path(tempfile.mkdtemp(prefix="celeriac-demo-"))
    os.chdir(workdir)  # celeriac.db lands here: the embedded default broker
    sys.path.insert(0, str(HERE))
    from tasks import add, app, flaky

    env = {**os.environ, "PYTHONPATH": str(HERE)}
    worker = subprocess.Popen(
        [sys.executable, "-m", "celeriac", "-A", "tasks", "worker", "-l", "warning"],
        cwd=workdir, env=env,
    )
    console.print(f"[bold]celeriac demo[/]: worker pid {worker.pid}, broker "
                  f"{app.settings.broker_url} in {workdir}")
    try:
        return run(console, opts, app, add, flaky, worker)
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                code = worker.wait(timeout=30)
                console.print(f"worker stopped with SIGTERM, exit code {code}")
            except subprocess.TimeoutExpired:
                worker.kill()
                console.print("[red]worker did not stop within 30s after SIGTERM; killed[/]")


def run(console: Console, opts: argparse.Namespace, app, add, flaky, worker) -> int:  # type: ignore[no-untyped-def]
    n, n_flaky = opts.n, min(opts.flaky, opts.n)
    expected: dict[str, int] = {}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    started = time.perf_counter()
    with Progress(*columns, console=console) as progress:
        sending = progress.add_task("sending ", total=n)
        for i in range(n):
            if i < n_flaky:
                expected[flaky.delay(i).id] = i
            else:
                expected[add.delay(i, i).id] = 2 * i
            if i % 200 == 0:
                progress.update(sending, completed=i + 1)
        progress.update(sending, completed=n)
        sent_at = time.perf_counter()
        gathering = progress.add_task("results ", total=n)
        done = app.backend.wait_for(
            expected, opts.timeout, on_ready=lambda _m: progress.advance(gathering)
        )
    finished = time.perf_counter()

    wrong = [tid for tid, meta in done.items() if meta.result != expected[tid]]
    failed = [tid for tid, meta in done.items() if meta.state != "SUCCESS"]
    missing = len(expected) - len(done)
    retried = sum(1 for meta in done.values() if meta.retries > 0)
    table = Table(title="celeriac quickstart")
    for col in ("sent", "done", "failed", "wrong", "missing", "retried", "send/s", "tasks/s"):
        table.add_column(col, justify="right")
    table.add_row(
        str(n), str(len(done)), str(len(failed)), str(len(wrong)), str(missing), str(retried),
        f"{n / (sent_at - started):,.0f}", f"{len(done) / (finished - started):,.0f}",
    )
    console.print(table)
    if worker.poll() is not None:
        console.print(f"[red]the worker exited early with code {worker.returncode}[/]")
        return 1
    if missing or wrong or failed:
        console.print("[red]FAILED: some results are missing or wrong[/]")
        return 1
    console.print("[green]all results present and correct[/]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
