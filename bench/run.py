"""End-to-end no-op throughput of celeriac, per transport (``make bench``).

For each system under test and each run, on a fresh broker:

1. enqueue (batch): ``transport.publish_many`` of N no-op messages in batches (building
   the messages included); then the queue is purged.
2. enqueue (delay): N x ``noop.delay()``, one message per call.
3. drain: a worker starts on the full queue of step 2; timed from the moment it is
   consuming until ``app.backend.wait_for`` has every result.

The table shows the median of the runs and their min-max. Adding a system (Celery on
Redis, say) is one ``System`` subclass plus one line in ``SYSTEMS``.
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import contextlib
import logging
import os
import platform
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import pool_overhead  # noqa: E402
import tasks as bench_tasks  # noqa: E402  (bench/tasks.py, also the worker's -A module)

from celeriac import Celeriac  # noqa: E402
from celeriac.transports.base import Outgoing  # noqa: E402


class BenchError(Exception):
    """A run could not be measured (worker died, results missing, deadline passed)."""


# -- systems under test ----------------------------------------------------------------------

class System(abc.ABC):
    """One broker + result store + worker, driven from this process.

    The harness calls, per run: ``setup`` (fresh, empty broker), ``enqueue_batch`` then
    ``purge`` (optional), ``enqueue``, ``start_worker``, ``wait_results``, and always
    ``stop_worker`` and ``teardown``. Only the harness reads clocks, except
    ``start_worker``, which reports when the worker began consuming.
    """

    name: str
    """Row label."""
    detail: str
    """One line on how it runs (worker, pool), shown under the table."""

    @abc.abstractmethod
    def setup(self, workdir: Path) -> None:
        """A fresh, empty broker and result store for one run; ``workdir`` is empty."""

    @abc.abstractmethod
    def enqueue(self, n: int) -> list[str]:
        """Publish ``n`` no-op tasks one call each, as a user would; return the task ids."""

    def enqueue_batch(self, n: int, batch: int) -> bool:
        """Publish ``n`` no-op tasks ``batch`` at a time; False if the system cannot."""
        return False

    def purge(self) -> None:
        """Delete every waiting message (after ``enqueue_batch``)."""

    @abc.abstractmethod
    def start_worker(self, deadline: float) -> float:
        """Start one worker on the full queue; return the unix time it began consuming.

        Raise ``BenchError`` if it is not consuming by ``deadline`` (``time.monotonic``).
        """

    @abc.abstractmethod
    def wait_results(self, ids: list[str], timeout: float) -> int:
        """Block until every task's result is stored or ``timeout`` passes; return how
        many succeeded."""

    @abc.abstractmethod
    def stop_worker(self) -> None:
        """Stop the worker if it runs (bounded; idempotent; also after a failure)."""

    def teardown(self) -> None:
        """Release what ``setup`` made (bounded; idempotent)."""


class CeleriacSystem(System):
    """What the celeriac systems share: the app, ``delay``, ``publish_many``, results."""

    app: Celeriac
    noop: Any

    def enqueue(self, n: int) -> list[str]:
        delay = self.noop.delay
        return [delay().id for _ in range(n)]

    def enqueue_batch(self, n: int, batch: int) -> bool:
        # celeriac has no public batch send: build the messages as send_task does.
        app, name, transport = self.app, self.noop.name, self.app.transport
        for start in range(0, n, batch):
            items = []
            for _ in range(min(batch, n - start)):
                message, queue, delay = app._build(
                    name, (), None, countdown=None, eta=None, expires=None, queue=None,
                    priority=None, task_id=None, headers=None, serializer=None, retries=0,
                    time_limit=None, soft_time_limit=None, ignore_result=False,
                )
                items.append(Outgoing(queue, message, delay))
            transport.publish_many(items)
        return True

    def purge(self) -> None:
        self.app.transport.purge(self.app.settings.task_default_queue)

    def wait_results(self, ids: list[str], timeout: float) -> int:
        done = self.app.backend.wait_for(ids, timeout)
        return sum(1 for meta in done.values() if meta.state == "SUCCESS")

    def teardown(self) -> None:
        app = getattr(self, "app", None)
        if app is not None:
            app.close()


class CeleriacSQLite(CeleriacSystem):
    """The embedded broker: one SQLite file for messages and results, a worker process."""

    def __init__(self, pool: str = "solo", concurrency: int = 1) -> None:
        self.pool, self.concurrency = pool, concurrency
        self.name = f"celeriac sqlite {pool}" + (f" x{concurrency}" if pool != "solo" else "")
        self.detail = ("broker + results in one SQLite file (WAL); worker: `celeriac -A tasks "
                       f"worker --pool {pool} -c {concurrency} -l warning` subprocess")
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        self.db_path: Path | None = None

    def setup(self, workdir: Path) -> None:
        self.workdir = workdir
        self.db_path = workdir / "bench.db"
        self.log_path = workdir / "worker.log"
        self.app, self.noop = bench_tasks.make_app(f"sqlite:///{self.db_path}")
        # Open the file and create both schemas outside the timed parts.
        self.app.transport.ping()
        self.app.backend.get("warm-up")

    def start_worker(self, deadline: float) -> float:
        assert self.db_path is not None and self.log_path is not None
        exe = Path(sys.executable).with_name("celeriac")
        argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "celeriac"]
        argv += ["-A", "tasks", "worker", "--pool", self.pool, "-c", str(self.concurrency),
                 "-l", "warning"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("CELERIAC_")}
        env.update(
            CELERIAC_BROKER_URL=f"sqlite:///{self.db_path}",
            CELERIAC_BENCH_READY="1",
            CELERIAC_BENCH_PARENT=str(os.getpid()),
            PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")])),
        )
        with open(self.log_path, "wb") as log:
            # Own session: a Ctrl-C at the terminal reaches the bench only, which then
            # stops the worker itself (stop_worker), never leaving it behind.
            self.proc = subprocess.Popen(argv, cwd=self.workdir, env=env,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=log, start_new_session=True)
        _LIVE.add(self.proc)
        return self._read_ready(deadline)

    def _read_ready(self, deadline: float) -> float:
        assert self.proc is not None and self.proc.stdout is not None
        fd, buf = self.proc.stdout.fileno(), b""
        while True:
            for line in buf.decode(errors="replace").splitlines():
                if line.startswith(bench_tasks.READY_LINE):
                    return float(line.split()[1])
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BenchError(f"worker not consuming in time; log:\n{self._log_tail()}")
            readable, _, _ = select.select([fd], [], [], min(remaining, 0.5))
            if readable:
                chunk = os.read(fd, 4096)
                if not chunk:
                    self.proc.wait(5)
                    raise BenchError(f"worker exited ({self.proc.returncode}) before it was "
                                     f"ready; log:\n{self._log_tail()}")
                buf += chunk

    def _log_tail(self, lines: int = 20) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_results(self, ids: list[str], timeout: float) -> int:
        succeeded = super().wait_results(ids, timeout)
        if succeeded < len(ids) and self.proc is not None and self.proc.poll() is not None:
            raise BenchError(f"worker exited ({self.proc.returncode}) mid-drain; log:\n"
                             f"{self._log_tail()}")
        return succeeded

    def stop_worker(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_process(proc)
            if proc.returncode not in (0, None):
                console.print(f"[yellow]worker exited with {proc.returncode}; log:\n"
                              f"{self._log_tail()}[/]")

    def teardown(self) -> None:
        super().teardown()
        if self.db_path is not None:
            remove_doorbells(self.db_path)
            self.db_path = None


class CeleriacMemory(CeleriacSystem):
    """The in-process broker: producer and worker (its own event loop, in a thread) in
    this process, so they share one GIL."""

    def __init__(self, pool: str = "solo", concurrency: int = 1) -> None:
        self.pool, self.concurrency = pool, concurrency
        self.name = f"celeriac memory {pool}" + (f" x{concurrency}" if pool != "solo" else "")
        self.detail = (f"in-process broker + results; worker: Worker(pool={pool!r}, "
                       f"concurrency={concurrency}) on its own event loop in a thread of the "
                       "bench process" + ("; children relay results through it"
                                          if pool == "prefork" else ""))
        self.thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.worker: Any = None

    def setup(self, workdir: Path) -> None:
        # A new name is a new, empty broker and result store.
        self.app, self.noop = bench_tasks.make_app(f"memory://bench-{uuid.uuid4().hex}")

    def start_worker(self, deadline: float) -> float:
        ready = threading.Event()
        started: list[float] = []
        errors: list[BaseException] = []

        def on_ready(at: float) -> None:
            started.append(at)
            ready.set()

        # Added after the enqueue: a hook makes every publish call the hook runner.
        self.app.add_hooks(bench_tasks.OnReady(on_ready))
        self.worker = self.app.worker(install_signal_handlers=False, pool=self.pool,
                                      concurrency=self.concurrency)

        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            await self.worker.run_async()

        def run() -> None:
            try:
                asyncio.run(main())
            except BaseException as exc:
                errors.append(exc)
            finally:
                ready.set()

        self.thread = threading.Thread(target=run, name="bench-worker", daemon=True)
        self.thread.start()
        ready.wait(max(deadline - time.monotonic(), 0.0))
        if errors:
            raise BenchError(f"worker failed to start: {errors[0]!r}")
        if not started:
            raise BenchError("worker not consuming in time")
        return started[0]

    def stop_worker(self) -> None:
        thread, self.thread = self.thread, None
        if thread is None:
            return
        if self.loop is not None and thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self.loop.call_soon_threadsafe(self.worker.shutdown)
        thread.join(STOP_TIMEOUT)
        if thread.is_alive():
            console.print("[yellow]in-process worker did not stop in time; left as a "
                          "daemon thread[/]")
        self.loop = None


SYSTEMS: dict[str, Callable[[], System]] = {
    "sqlite": CeleriacSQLite,
    "sqlite-prefork": lambda: CeleriacSQLite("prefork", 2),
    "memory": CeleriacMemory,
    "memory-prefork": lambda: CeleriacMemory("prefork", 2),
}


# -- processes and files this bench leaves nothing of ----------------------------------------

STOP_TIMEOUT = 15.0
_LIVE: set[subprocess.Popen[bytes]] = set()
console = Console()
if not console.is_terminal:
    console = Console(width=100)  # piped (CI logs): room for the table


def stop_process(proc: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM (warm shutdown), then SIGKILL to its process group after ``timeout``."""
    try:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
    finally:
        if proc.stdout is not None:
            proc.stdout.close()
        _LIVE.discard(proc)


def stop_all() -> None:
    for proc in list(_LIVE):
        with contextlib.suppress(Exception):
            stop_process(proc, timeout=5.0)


def remove_doorbells(db_path: Path) -> None:
    """celeriac's SQLite doorbell directories outlive the database file: remove them."""
    try:
        from celeriac._sqlite import Doorbell
    except ImportError:
        return
    shutil.rmtree(Doorbell(str(db_path), "messages").dir.parent, ignore_errors=True)


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so every ``finally`` (worker cleanup) runs."""
    def raise_interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        stop_all()


# -- measuring -----------------------------------------------------------------------------

@dataclass
class Run:
    enqueue: float
    """tasks/s, one delay() per task"""
    enqueue_batch: float | None
    """tasks/s, publish_many in batches; None if not measured"""
    startup: float
    """seconds from asking for a worker to it consuming"""
    drain: float
    """tasks/s, worker consuming -> every result stored"""


@dataclass
class Outcome:
    system: System
    runs: list[Run] = field(default_factory=list)
    error: str | None = None


def measure(system: System, n: int, batch: int, timeout: float, workdir: Path) -> Run:
    system.setup(workdir)
    try:
        batch_rate = None
        if batch:
            t0 = time.perf_counter()
            if system.enqueue_batch(n, batch):
                batch_rate = n / (time.perf_counter() - t0)
            system.purge()
        t0 = time.perf_counter()
        ids = system.enqueue(n)
        enqueue_rate = n / (time.perf_counter() - t0)

        asked = time.time()
        started = system.start_worker(time.monotonic() + timeout)
        succeeded = system.wait_results(ids, timeout)
        finished = time.time()
        if succeeded < n:
            raise BenchError(f"{n - succeeded} of {n} results missing or not SUCCESS after "
                             f"{timeout:.0f}s")
        return Run(enqueue_rate, batch_rate, started - asked, n / (finished - started))
    finally:
        try:
            system.stop_worker()
        finally:
            system.teardown()


def bench(system: System, opts: argparse.Namespace, root: Path) -> Outcome:
    outcome = Outcome(system)
    for i in range(1, opts.runs + 1):
        workdir = root / f"{system.name.replace(' ', '-')}-{i}"
        workdir.mkdir()
        try:
            run = measure(system, opts.n, opts.batch, opts.timeout, workdir)
        except BenchError as exc:
            outcome.error = f"run {i}: {exc}"
            console.print(f"[red]{system.name} run {i}/{opts.runs} failed: {exc}[/]")
            return outcome
        outcome.runs.append(run)
        batch = f"  batch {run.enqueue_batch:,.0f}/s" if run.enqueue_batch else ""
        console.print(f"  {system.name} {i}/{opts.runs}: delay {run.enqueue:,.0f}/s{batch}"
                      f"  drain {run.drain:,.0f}/s  worker up {run.startup * 1000:,.0f} ms")
    return outcome


# -- reporting -----------------------------------------------------------------------------

def cell(values: list[float | None], fmt: str) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    mid = format(statistics.median(got), fmt)
    if len(got) == 1:
        return mid
    return f"{mid}\n[dim]{format(min(got), fmt)}-{format(max(got), fmt)}[/]"


def report(outcomes: list[Outcome], opts: argparse.Namespace) -> Table:
    table = Table(title=f"celeriac no-op throughput: N={opts.n:,} tasks, median of "
                        f"{opts.runs} run(s) (min-max below)")
    table.add_column("system")
    table.add_column("enqueue\ndelay()\ntasks/s", justify="right")
    if opts.batch:
        table.add_column(f"enqueue\npublish_many\nx{opts.batch} tasks/s", justify="right")
    table.add_column("drain\nrun + results\ntasks/s", justify="right")
    table.add_column("worker\nstartup\nms", justify="right")
    for o in outcomes:
        if not o.runs:
            cols = ["[red]failed[/]"] * (4 if opts.batch else 3)
        else:
            cols = [cell([r.enqueue for r in o.runs], ",.0f")]
            if opts.batch:
                cols.append(cell([r.enqueue_batch for r in o.runs], ",.0f"))
            cols += [cell([r.drain for r in o.runs], ",.0f"),
                     cell([r.startup * 1000 for r in o.runs], ",.0f")]
        table.add_row(o.system.name + (" [red](incomplete)[/]" if o.error and o.runs else ""),
                      *cols)
    return table


def ratios(outcomes: list[Outcome]) -> None:
    """Prefork (2 children) drain over solo drain, per transport, from this run."""
    drains = {o.system.name: statistics.median(r.drain for r in o.runs)
              for o in outcomes if o.runs}
    for transport in ("sqlite", "memory"):
        solo = drains.get(f"celeriac {transport} solo")
        prefork = drains.get(f"celeriac {transport} prefork x2")
        if solo and prefork:
            console.print(f"{transport}: prefork x2 drains {prefork / solo:.2f}x the solo pool")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=5000, help="tasks per run (default 5000)")
    parser.add_argument("--runs", type=int, default=3, help="runs per system (default 3)")
    parser.add_argument("--transports", "--systems", default=",".join(SYSTEMS),
                        help=f"comma-separated, from: {', '.join(SYSTEMS)} (default: all)")
    parser.add_argument("--batch", type=int, default=500,
                        help="publish_many batch size; 0 skips it (default 500)")
    parser.add_argument("--no-pool-overhead", dest="pool_overhead", action="store_false",
                        help="skip the prefork pool overhead measurement")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="deadline in seconds for each wait (default 60)")
    opts = parser.parse_args(argv)
    # The in-process worker's expected lines ("warm shutdown: ...") are not news.
    logging.getLogger("celeriac").setLevel(logging.ERROR)
    names = [s.strip() for s in opts.transports.split(",") if s.strip()]
    unknown = [s for s in names if s not in SYSTEMS]
    if unknown or not names:
        parser.error(f"unknown --transports {unknown}; known: {', '.join(SYSTEMS)}")
    if opts.n < 1 or opts.runs < 1 or opts.batch < 0 or opts.timeout <= 0:
        parser.error("--n and --runs must be >= 1, --batch >= 0, --timeout > 0")

    console.print(f"[bold]celeriac bench[/]: {opts.n:,} no-op tasks x {opts.runs} run(s) on "
                  f"{', '.join(names)}; Python {platform.python_version()}, "
                  f"{os.cpu_count()} CPU(s)")
    outcomes: list[Outcome] = []
    began = time.monotonic()
    with terminate_as_interrupt(), tempfile.TemporaryDirectory(prefix="celeriac-bench-") as tmp:
        try:
            for name in names:
                outcomes.append(bench(SYSTEMS[name](), opts, Path(tmp)))
        except KeyboardInterrupt:
            console.print("[yellow]interrupted; workers stopped[/]")
            return 130
    console.print(report(outcomes, opts))
    for o in outcomes:
        console.print(f"[dim]{o.system.name}: {o.system.detail}[/]")
    ratios(outcomes)
    if opts.pool_overhead:
        overhead = pool_overhead.measure(runs=opts.runs)
        console.print(
            f"prefork pool overhead per task: {overhead['pool_us']:.1f} us; raw pipe round "
            f"trip between two Python processes: {overhead['raw_us']:.1f} us; ratio "
            f"{overhead['ratio']:.2f}x (target <= 3x)")
    console.print(f"[dim]total {time.monotonic() - began:.0f}s[/]")
    return 1 if any(o.error for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
