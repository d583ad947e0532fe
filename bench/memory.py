"""Broker memory per queued task, and the worker's resident memory while it drains.

Bytes per message: N no-argument tasks (``bench.noop``) are queued on a redis-server of
this measurement's own (a free port, ``--save "" --appendonly no``, emptied between
systems), and ``INFO memory`` ``used_memory`` is read before and after; the difference
over N is the figure. Three layouts: celeriac's own (``delay_many``), celeriac's kombu
layout in compatibility mode (``?layout=kombu``, Celery's wire in kombu's keys), and
Celery 5 itself (``send_task`` on a held producer in ``SENDERS`` processes that share
the N, in bench/.venv-celery, which ``bench/run.py`` makes on first use; skipped with a
note when it is missing). Each side sends one task first (connections, scripts, kombu's
bindings), then the measured N. ``--layouts`` picks some (Celery's is slow: 230-700
``send_task``/s per process on a loaded 2-CPU machine).

RSS: a celeriac worker (prefork x2) drains ``--rss-n`` queued no-op tasks from the same
server; the main process's and each child's resident memory are sampled every
``SAMPLE_SECONDS``. Flat means no process grows by more than ``GROWTH_MIB`` beyond what
it held once the first tenth (at most 100,000) was drained: imports, caches and buffers
are warm by then.

    .venv/bin/python bench/memory.py --n 1000000 --rss-n 1000000 --layouts celeriac,kombu
    .venv/bin/python bench/memory.py --n 200000 --rss-n 0 --layouts celery
    .venv/bin/python bench/run.py ...   # a short form: --memory-n 50000 (0 skips it)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis
import tasks as bench_tasks
from harness import (
    HERE,
    BenchError,
    WorkerProcess,
    console,
    stop_process,
    terminate_as_interrupt,
)
from measuring import process_tree, rss_mib

SENDERS = 2
"""Celery's sender processes (``celery_bytes``)."""
SAMPLE_SECONDS = 2.0
GROWTH_MIB = 5.0
"""Largest growth of one process after the warm-up that still counts as flat."""
CELERY_PYTHON = HERE / ".venv-celery" / "bin" / "python"
CELERY_SENDER = r"""
import sys, time
from celery import Celery
app = Celery("bench", broker=sys.argv[1])
n = int(sys.argv[2])
with app.producer_or_acquire() as producer:
    app.send_task("bench.noop", producer=producer)
    print("warm", flush=True)
    sys.stdin.readline()
    began = time.perf_counter()
    for _ in range(n):
        app.send_task("bench.noop", producer=producer)
    print("sent", time.perf_counter() - began, flush=True)
    sys.stdin.readline()
"""


class RedisServer:
    """A redis-server of our own on a free loopback port, nothing persisted."""

    def __init__(self, workdir: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        self.client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client.ping()
                return
            except redis.ConnectionError as exc:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.close()
                    raise BenchError("memory: the bench's own redis-server did not start") \
                        from exc
                time.sleep(0.05)

    def url(self, query: str = "") -> str:
        return f"redis://127.0.0.1:{self.port}/0{query}"

    def used(self) -> int:
        return int(self.client.info("memory")["used_memory"])

    def close(self) -> None:
        self.client.close()
        stop_process(self.proc)


def celeriac_bytes(server: RedisServer, n: int, query: str = "") -> float:
    server.client.flushall()
    app, noop = bench_tasks.make_app(server.url(query))
    try:
        noop.delay()  # scripts loaded, connections made
        before = server.used()
        for start in range(0, n, 100_000):
            noop.delay_many([()] * min(100_000, n - start), chunk_size=1000)
        return (server.used() - before) / n
    finally:
        app.close()


def celery_bytes(server: RedisServer, n: int, timeout: float, senders: int = SENDERS
                 ) -> float | None:
    """Celery's figure: ``senders`` processes (Celery's ``send_task`` is a round trip
    and about a millisecond of Python each) share the ``n``, all warm before the count."""
    if not CELERY_PYTHON.exists():
        return None
    server.client.flushall()
    shares = [n // senders + (i < n % senders) for i in range(senders)]
    procs = [subprocess.Popen([str(CELERY_PYTHON), "-c", CELERY_SENDER, server.url(),
                               str(share)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for share in shares]
    try:
        for proc in procs:
            if _line(proc) != "warm":
                raise BenchError("memory: Celery's sender did not start")
        before = server.used()
        for proc in procs:
            _say(proc, "go")
        for proc in procs:
            if not _line(proc).startswith("sent"):
                raise BenchError("memory: Celery's sender failed")
        after = server.used()
        for proc in procs:
            _say(proc, "quit")
            proc.wait(timeout)
        return (after - before) / n
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().strip()


def _say(proc: subprocess.Popen[str], text: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(text + "\n")
    proc.stdin.flush()


LAYOUTS = {
    "celeriac": ("celeriac", lambda server, n, timeout: celeriac_bytes(server, n)),
    "kombu": ("celeriac ?layout=kombu",
              lambda server, n, timeout: celeriac_bytes(server, n, "?layout=kombu")),
    "celery": ("Celery 5", celery_bytes),
}
"""``--layouts`` -> (the name printed, its measurement)."""


def drain_rss(server: RedisServer, n: int, workdir: Path, timeout: float
              ) -> list[tuple[int, float, dict[int, float]]]:
    """(tasks drained, seconds, {pid: RSS MiB}) every SAMPLE_SECONDS while a worker
    drains ``n`` queued no-op tasks."""
    server.client.flushall()
    url = server.url()
    app, noop = bench_tasks.make_app(url)
    for start in range(0, n, 100_000):
        noop.delay_many([()] * min(100_000, n - start), chunk_size=1000)
    exe = Path(sys.executable).with_name("celeriac")
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "celeriac"]
    argv += ["-A", "tasks", "worker", "--pool", "prefork", "-c", "2", "-l", "warning"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERIAC_")}
    env.update(CELERIAC_BROKER_URL=url,
               PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")])))
    worker = WorkerProcess(argv, env, workdir, workdir / "rss-worker.log")
    samples: list[tuple[int, float, dict[int, float]]] = []
    try:
        started = worker.start(time.monotonic() + timeout)
        deadline = time.monotonic() + timeout + n / 500
        while True:
            left = app.transport.queue_length("celery")
            assert worker.proc is not None
            rss = {p: r for p in process_tree(worker.proc.pid) if (r := rss_mib(p)) is not None}
            samples.append((n - left, time.time() - started, rss))
            if left == 0:
                return samples
            worker.check_alive("mid-drain")
            if time.monotonic() > deadline:
                raise BenchError(f"memory: {left:,} of {n:,} tasks still queued at the deadline")
            time.sleep(SAMPLE_SECONDS)
    finally:
        worker.stop()
        app.close()


def rss_verdict(samples: list[tuple[int, float, dict[int, float]]], n: int) -> str:
    warm = min(100_000, max(n // 10, 1))
    base = next((s for s in samples if s[0] >= warm), samples[-1])
    later = [s for s in samples if s[1] >= base[1]]
    root = next(iter(base[2]), 0)  # process_tree lists the worker's main process first
    parts, worst = [], 0.0
    for pid, start in base[2].items():
        seen = [s[2][pid] for s in later if pid in s[2]]
        grew = max(seen) - start
        worst = max(worst, grew)
        name = "main" if pid == root else f"child {pid}"
        parts.append(f"{name} {start:.1f} -> max {max(seen):.1f} -> end {seen[-1]:.1f} MiB")
    flat = "[green]flat[/]" if worst < GROWTH_MIB else "[red]grew[/]"
    took = samples[-1][1]
    return (f"worker RSS draining {n:,} (prefork x2, {took:.0f}s, {len(samples)} samples, "
            f"from {base[0]:,} drained): {'; '.join(parts)}; largest growth {worst:+.1f} MiB "
            f"(< {GROWTH_MIB:g}: {flat})")


def measure(n: int, rss_n: int, timeout: float, root: Path | None = None,
            layouts: Sequence[str] = tuple(LAYOUTS), show: Callable[[str], Any] | None = None
            ) -> list[str]:
    """The report's lines: bytes per message for each of ``layouts`` (Celery's first, so
    the others show their ratio to it), then the RSS check; none when both counts are 0.
    ``show`` is given each line as soon as it is measured."""
    if n <= 0 and rss_n <= 0:
        return []
    lines: list[str] = []

    def add(line: str) -> None:
        lines.append(line)
        if show is not None:
            show(line)

    with contextlib.ExitStack() as stack:
        workdir = root or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        workdir = workdir / "memory"
        workdir.mkdir(exist_ok=True)
        server = RedisServer(workdir)
        stack.callback(server.close)
        celery: float | None = None
        for key in sorted(layouts, key=lambda k: k != "celery") if n > 0 else ():
            name, how = LAYOUTS[key]
            value = how(server, n, timeout)
            celery = value if key == "celery" else celery
            ratio = f" ({value / celery:.2f}x Celery's)" if value and celery else ""
            shown = "not measured (no bench/.venv-celery)" if value is None else \
                f"{value:,.0f} bytes a message{ratio}"
            add(f"broker memory, {n:,} queued no-argument tasks, {name}: {shown}")
        if rss_n > 0:
            add(rss_verdict(drain_rss(server, rss_n, workdir, timeout), rss_n))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000,
                        help="tasks queued per layout for bytes per message (0 skips)")
    parser.add_argument("--rss-n", type=int, default=200_000,
                        help="tasks the worker drains for the RSS check (0 skips)")
    parser.add_argument("--layouts", default=",".join(LAYOUTS),
                        help=f"comma-separated, from: {', '.join(LAYOUTS)} (default: all)")
    parser.add_argument("--timeout", type=float, default=120.0)
    opts = parser.parse_args(argv)
    layouts = [x.strip() for x in opts.layouts.split(",") if x.strip()]
    if opts.n < 0 or opts.rss_n < 0 or not set(layouts) <= set(LAYOUTS):
        parser.error(f"--n and --rss-n must be >= 0, --layouts from {', '.join(LAYOUTS)}")
    try:
        with terminate_as_interrupt():
            measure(opts.n, opts.rss_n, opts.timeout, layouts=layouts, show=console.print)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted; the worker and the servers stopped[/]")
        return 130
    except BenchError as exc:
        console.print(f"[red]{exc}[/]")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
