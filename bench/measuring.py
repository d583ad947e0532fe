"""One run of one system (``measure``: enqueue, drain, round trips, canvas), the
interleaved runs of them all (``bench``), the figures they give (``Run``, ``Outcome``),
worker memory, and the memory soak."""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from celeriac_systems import CeleriacProcess
from harness import BenchError, WorkerProcess, console, io_counter, percentile
from peer_systems import PeerSystem
from rich.markup import escape
from systems import System


@dataclass
class Run:
    enqueue: float
    """tasks/s, one delay() per task"""
    bulk: dict[str, float]
    """tasks/s per bulk method"""
    startup: float
    """seconds from asking for a worker to it consuming"""
    drain: float
    """tasks/s, worker consuming -> every result stored"""
    p50: float | None
    """seconds, one delay() + get() with an idle worker"""
    p99: float | None
    rss_parent: float | None = None
    """MiB, the (first) worker's main process after the drain"""
    rss_child: float | None = None
    """MiB, its largest other process after the drain"""
    group: float | None = None
    """seconds, a group of --canvas-n no-ops sent -> every result back"""
    chord: float | None = None
    """seconds, a chord of --chord-n no-ops sent -> its body's result"""
    canvas_errors: dict[str, str] = field(default_factory=dict)
    """"group"/"chord" -> why that row failed in this run (the rest of the run stands)"""
    load: float | None = None
    """The machine's 1-minute load average at the end of the run (shared machines)"""

    @property
    def best_bulk(self) -> float | None:
        return max(self.bulk.values()) if self.bulk else None


@dataclass
class Outcome:
    system: System
    runs: list[Run] = field(default_factory=list)
    error: str | None = None

    def median(self, metric: Callable[[Run], float | None]) -> float | None:
        got = [v for v in map(metric, self.runs) if v is not None]
        return statistics.median(got) if got else None


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (Linux ``/proc``)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
    return out


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def worker_rss(worker: WorkerProcess | None) -> tuple[float | None, float | None]:
    """(main process, largest other process) resident memory of a worker subprocess."""
    if not isinstance(worker, WorkerProcess) or worker.proc is None:
        return None, None
    root, *others = process_tree(worker.proc.pid)
    children = [r for r in map(rss_mib, others) if r is not None]
    return rss_mib(root), max(children, default=None)


def measure(system: System, opts: argparse.Namespace, workdir: Path) -> Run:
    n, timeout = opts.n * system.scale, opts.timeout
    system.setup(workdir)
    if system.io:
        client = io_counter()
        client.delete(system.io_key)
        client.close()
    try:
        bulk = {}
        if opts.batch and not system.io:
            for method in system.bulk_methods:
                t0 = time.perf_counter()
                system.enqueue_bulk(n, opts.batch, method)
                bulk[method] = n / (time.perf_counter() - t0)
                system.purge()
        t0 = time.perf_counter()
        system.enqueue(n)
        enqueue_rate = n / (time.perf_counter() - t0)

        asked = time.time()
        started = system.start_worker(time.monotonic() + timeout)
        succeeded = system.wait_results(timeout)
        finished = time.time()
        rss = worker_rss(getattr(system, "worker", None))
        if succeeded < n:
            raise BenchError(f"{n - succeeded} of {n} results missing or not SUCCESS after "
                             f"{timeout:.0f}s; {system.diagnostics()}")
        p50 = p99 = None
        if opts.latency and not system.io:
            try:
                samples = system.latency(opts.latency, opts.warmup, timeout)
            except BenchError:
                raise
            except Exception as exc:
                raise BenchError(f"round trip failed: {type(exc).__name__}: {exc}") from exc
            p50, p99 = percentile(samples, 50), percentile(samples, 99)
        run = Run(enqueue_rate, bulk, started - asked, n / (finished - started), p50, p99,
                  *rss, load=os.getloadavg()[0])
        if opts.canvas and system.canvas:
            measure_canvas(system, opts, run)
        return run
    finally:
        try:
            system.stop_worker()
        finally:
            system.teardown()


def measure_canvas(system: System, opts: argparse.Namespace, run: Run) -> None:
    """The group and chord rows, on the run's idle worker. A row that fails is recorded
    in ``run.canvas_errors`` and shown as failed; the run's other figures stand."""
    for row, size, call in (("group", opts.canvas_n, system.canvas_group),
                            ("chord", opts.chord_n, system.canvas_chord)):
        try:
            setattr(run, row, call(size, opts.timeout))
        except Exception as exc:
            message = str(exc) if isinstance(exc, BenchError) else f"{type(exc).__name__}: {exc}"
            run.canvas_errors[row] = message
            console.print(f"[red]{system.name}: {row} of {size:,} failed: {escape(message)}[/]")


SOAK_GROWTH_MIB = 5.0
"""A worker's processes may grow by less than this over the soak, after its first tenth."""


def memory_soak(n: int, root: Path, timeout: float) -> str:
    """One celeriac Redis worker (prefork x2) drains ``n`` no-op tasks with results; its
    processes' resident memory is read once a tenth is done and at the end. Growth after
    the first tenth (imports, caches and buffers warmed up) would be a leak."""
    system = CeleriacProcess("redis-soak", "redis", "prefork", 2)
    workdir = root / "soak"
    workdir.mkdir()
    system.setup(workdir)
    try:
        ids = [r.id for r in system.noop.delay_many([()] * n, chunk_size=1000)]
        started = system.start_worker(time.monotonic() + timeout)
        samples: list[tuple[str, list[float | None]]] = []
        for mark in (n // 10, n):
            # Tasks run about in the order sent: the mark-th result stands for the first
            # mark (in slices, to notice a worker that died).
            deadline = time.monotonic() + timeout * 10
            while not system.app.backend.wait_for([ids[mark - 1]], 1.0):
                if time.monotonic() > deadline:
                    raise BenchError(f"soak: task {mark:,} of {n:,} not done in time")
                assert system.worker is not None
                system.worker.check_alive("mid-soak")
            assert system.worker is not None and system.worker.proc is not None
            samples.append((f"{mark:,}", [rss_mib(p) for p in
                                          process_tree(system.worker.proc.pid)]))
        elapsed = time.time() - started
    finally:
        system.stop_worker()
        system.teardown()
    (first_at, first), (last_at, last) = samples
    growth = [b - a for a, b in zip(first, last, strict=False) if a is not None and b is not None]
    worst = max(growth, default=0.0)
    verdict = "[green]yes[/]" if worst < SOAK_GROWTH_MIB else "[red]no[/]"
    shown = "; ".join(f"{name} {a:.1f} -> {b:.1f} MiB" for name, a, b in zip(
        ["main", *(f"child {i}" for i in range(1, len(first)))], first, last, strict=False)
        if a is not None and b is not None)
    return (f"memory soak: {n:,} tasks in {elapsed:.0f}s on one worker (prefork x2); "
            f"resident memory at {first_at} -> at {last_at} tasks: {shown}; largest growth "
            f"{worst:+.1f} MiB (target < {SOAK_GROWTH_MIB:g} MiB: {verdict})")


def bench(systems: list[System], opts: argparse.Namespace, root: Path) -> list[Outcome]:
    """Run i of every system, then run i + 1 of every system...: interleaved, so that a
    machine that slows down or speeds up over the minutes of a bench (these are shared
    machines) weighs on every system alike, and ratios between them hold."""
    outcomes = [Outcome(system) for system in systems]
    try:
        for system in systems:
            if isinstance(system, PeerSystem):
                system.timeout = opts.timeout
        for i in range(1, opts.runs + 1):
            for outcome in outcomes:
                if outcome.error is None:
                    run_once(outcome, i, opts, root)
    finally:
        for system in systems:
            system.close()
    return outcomes


def run_once(outcome: Outcome, i: int, opts: argparse.Namespace, root: Path) -> None:
    system = outcome.system
    workdir = root / f"{system.key}-{i}"
    workdir.mkdir()
    try:
        run = measure(system, opts, workdir)
    except Exception as exc:  # one system failing does not stop the others
        message = str(exc) if isinstance(exc, BenchError) else f"{type(exc).__name__}: {exc}"
        outcome.error = f"run {i}: {message}"
        console.print(f"[red]{system.name} run {i}/{opts.runs} failed: {message}[/]")
        return
    outcome.runs.append(run)
    bulk = "".join(f"  {m} {r:,.0f}/s" for m, r in run.bulk.items())
    rt = (f"  round trip p50 {run.p50 * 1e3:.2f} ms p99 {run.p99 * 1e3:.2f} ms"
          if run.p50 is not None and run.p99 is not None else "")
    canvas = "".join(f"  {row} {'failed' if value is None else f'{value * 1e3:,.0f} ms'}"
                     for row, value in (("group", run.group), ("chord", run.chord))
                     if value is not None or row in run.canvas_errors)
    console.print(f"  {system.name} {i}/{opts.runs}: delay {run.enqueue:,.0f}/s{bulk}"
                  f"  drain {run.drain:,.0f}/s{rt}{canvas}  worker up "
                  f"{run.startup * 1000:,.0f} ms  load {run.load:.2f}")
