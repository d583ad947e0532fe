"""End-to-end no-op benchmark: celeriac against Celery (and peers) on one Redis (``make bench``).

Runs are interleaved (run 1 of every system, then run 2 of every system...). In each run
of each system, on a fresh, empty broker and result store:

1. enqueue (bulk): N no-op tasks through the system's bulk API (each bulk method in
   turn); the queue is purged after each.
2. enqueue (delay): N x ``noop.delay()``, one message per call.
3. drain: a worker (2 prefork processes for the Redis systems) starts on the full queue
   of step 2; timed from the moment it is consuming until every result is stored.
4. round trip: with the worker idle, ``noop.delay().get()`` one call at a time.
5. canvas (celeriac on Redis and Celery only), on the same idle worker: a group of
   ``--canvas-n`` no-ops sent and joined, then a chord of ``--chord-n`` no-ops, timed from
   sending to its body's result. Last, so that a chord that never completes (the worker
   retrying its header) disturbs no other figure.

celeriac runs in this process (this virtualenv). Each peer (Celery, ...) runs in its own
virtualenv, ``bench/.venv-<peer>``, made on first use: a driver script there
(``bench/peers/<peer>_driver.py``) is this process's producer, and its worker is that
virtualenv's command line. Every figure is the median of the runs; a ratio table compares
celeriac on Redis with each peer.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import control_ping
import flow
import latency_load
import memory as broker_memory
import outbox as bench_outbox
import pool_overhead
import producers
import startup as bench_startup
from celeriac_systems import CeleriacMemory, CeleriacProcess
from harness import PEERS, BenchError, console, machine_lock, terminate_as_interrupt
from measuring import Outcome, bench, memory_soak
from peer_systems import PeerSystem
from report import (
    REFERENCE,
    canvas_failures,
    details,
    events_cost,
    pool_ratios,
    ratio_table,
    report,
    sleep_table,
)
from sqs_system import CeleriacSQS
from systems import System

# The --systems names, in the order they run and are shown.
SYSTEMS: dict[str, Callable[[], System]] = {
    "redis": lambda: CeleriacProcess("redis", "redis", "prefork", 2, canvas=True),
    "redis-io": lambda: CeleriacProcess("redis-io", "redis", "prefork", 2, io=True),
    "redis-x4": lambda: CeleriacProcess("redis-x4", "redis", "prefork", 2, scale=4),
    "redis-fair": lambda: CeleriacProcess("redis-fair", "redis", "prefork", 2, fair=True),
    "redis-events": lambda: CeleriacProcess("redis-events", "redis", "prefork", 2, events=True),
    "redis-events-watched": lambda: CeleriacProcess("redis-events-watched", "redis", "prefork",
                                                    2, events=True, watched=True),
    **{key: (lambda peer=peer: PeerSystem(peer)) for key, peer in PEERS.items()},
    **{f"{key}-io": (lambda peer=peer: PeerSystem(peer, io=True)) for key, peer in PEERS.items()},
    # 10 ms of waiting per task (issue 16): async tasks on the children's loops, the
    # threads pool, and the peers' thread pools (Celery threads x16, Dramatiq 2 x 8).
    "redis-async-sleep": lambda: CeleriacProcess(
        "redis-async-sleep", "redis", "prefork", 2, sleep="async",
        args=("--child-concurrency", "100")),
    "redis-threads-sleep": lambda: CeleriacProcess("redis-threads-sleep", "redis", "threads",
                                                   16, sleep="sync"),
    "redis-sleep": lambda: CeleriacProcess("redis-sleep", "redis", "prefork", 2, sleep="sync"),
    "celery-threads-sleep": lambda: PeerSystem(
        PEERS["celery"], sleep=True, label="threads x16", key="celery-threads-sleep",
        worker=("celery", "-A", "celery_app", "worker", "--pool", "threads", "-c", "16",
                "-l", "warning")),
    "dramatiq-sleep": lambda: PeerSystem(PEERS["dramatiq"], sleep=True, label="2 procs x 8"),
    "sqlite": lambda: CeleriacProcess("sqlite", "sqlite"),
    "sqlite-fair": lambda: CeleriacProcess("sqlite-fair", "sqlite", fair=True),
    "sqs": CeleriacSQS,
    "sqlite-prefork": lambda: CeleriacProcess("sqlite-prefork", "sqlite", "prefork", 2),
    "memory": CeleriacMemory,
    "memory-prefork": lambda: CeleriacMemory("prefork", 2),
}


OPT_IN = {"sqs"}
"""Systems run only when --systems names them: on moto's server the SQS row drained 75
tasks/s here, minutes a run at the default --n (bench/sqs_system.py)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=10_000, help="tasks per run (default 10000)")
    parser.add_argument("--runs", type=int, default=3, help="runs per system (default 3)")
    parser.add_argument("--systems", "--transports", dest="systems",
                        default=",".join(k for k in SYSTEMS if k not in OPT_IN),
                        help=f"comma-separated, from: {', '.join(SYSTEMS)} (default: all "
                             f"but {', '.join(sorted(OPT_IN))})")
    parser.add_argument("--batch", type=int, default=1000,
                        help="bulk enqueue: messages per round trip; 0 skips the bulk "
                             "enqueue (default 1000)")
    parser.add_argument("--latency", type=int, default=200,
                        help="round trips timed per run; 0 skips them (default 200)")
    parser.add_argument("--warmup", type=int, default=10,
                        help="untimed round trips before those (default 10)")
    parser.add_argument("--no-flow", dest="flow", action="store_false",
                        help="skip the unique check's cost per delay() (bench/flow.py)")
    parser.add_argument("--no-pool-overhead", dest="pool_overhead", action="store_false",
                        help="skip the prefork pool overhead measurement")
    parser.add_argument("--memory-n", type=int, default=50_000,
                        help="broker memory: no-argument tasks queued per layout (celeriac, "
                             "kombu layout, Celery) for bytes per message, and twice as many "
                             "drained for the worker's RSS (bench/memory.py); 0 skips it")
    parser.add_argument("--soak", type=int, default=100_000,
                        help="tasks of the memory soak: one celeriac worker drains them and "
                             "its memory is read as it goes; 0 skips it (default 100000)")
    parser.add_argument("--canvas-n", type=int, default=10_000,
                        help="canvas: tasks in the group that is sent and joined (celeriac "
                             "on Redis and Celery; default 10000)")
    parser.add_argument("--chord-n", type=int, default=1000,
                        help="canvas: header tasks of the chord timed to its body's result "
                             "(default 1000)")
    parser.add_argument("--no-canvas", dest="canvas", action="store_false",
                        help="skip the canvas rows (group join, chord)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="deadline in seconds for each wait (default 60)")
    parser.add_argument("--ping", action="store_true",
                        help="also time `inspect ping` with 1 and 5 workers, celeriac "
                             "against Celery (bench/control_ping.py)")
    parser.add_argument("--outbox", action="store_true",
                        help="also time delay() inside app.transaction(conn) against a plain "
                             "delay() (bench/outbox.py; needs PostgreSQL)")
    parser.add_argument("--no-producers", dest="producers", action="store_false",
                        help="skip delay()/s from 1 and 16 threads (bench/producers.py)")
    parser.add_argument("--no-startup", dest="startup", action="store_false",
                        help="skip import, --help and worker-ready times (bench/startup.py)")
    parser.add_argument("--latency-load", action="store_true",
                        help="also time delay() to task start while sending at half the "
                             "maximum drain for 30 s (bench/latency_load.py; minutes)")
    parser.add_argument("--lock-timeout", type=float, default=600.0,
                        help="how long to wait for another bench run on this machine to "
                             "finish (default 600)")
    opts = parser.parse_args(argv)
    # The in-process worker's expected lines ("warm shutdown: ...") are not news.
    logging.getLogger("celeriac").setLevel(logging.ERROR)
    names = [s.strip() for s in opts.systems.split(",") if s.strip()]
    unknown = [s for s in names if s not in SYSTEMS]
    if unknown or not names:
        parser.error(f"unknown --systems {unknown}; known: {', '.join(SYSTEMS)}")
    if (opts.n < 1 or opts.runs < 1 or opts.batch < 0 or opts.latency < 0 or opts.warmup < 0
            or opts.timeout <= 0 or opts.canvas_n < 1 or opts.chord_n < 1):
        parser.error("--n, --runs, --canvas-n and --chord-n must be >= 1, --batch, --latency "
                     "and --warmup >= 0, --timeout > 0")

    console.print(f"[bold]celeriac bench[/]: {opts.n:,} no-op tasks x {opts.runs} run(s) on "
                  f"{', '.join(names)}; Python {platform.python_version()}, "
                  f"{os.cpu_count()} CPU(s)")
    outcomes: list[Outcome] = []
    began = time.monotonic()
    with terminate_as_interrupt(), tempfile.TemporaryDirectory(prefix="celeriac-bench-") as tmp:
        try:
            with machine_lock(opts.lock_timeout):
                outcomes = bench([SYSTEMS[name]() for name in names], opts, Path(tmp))
                overhead = pool_overhead.measure(runs=min(opts.runs, 3)) \
                    if opts.pool_overhead else None
                soak = memory_soak(opts.soak, Path(tmp), opts.timeout) if opts.soak else None
                broker_mem = broker_memory.measure(opts.memory_n, 2 * opts.memory_n,
                                                   opts.timeout, Path(tmp))
                unique = flow.measure_if(opts.flow, opts.n, opts.runs)
                pings = None
                if opts.ping:
                    pings = control_ping.measure(
                        [n for n in ("celeriac", "celery") if n == "celeriac" or n in names],
                        control_ping.WORKERS, control_ping.PINGS, Path(tmp) / "ping")
                outbox = bench_outbox.measure_if(opts.outbox, opts.n, opts.runs)
                threaded = producers.measure_if(opts.producers, opts.n, opts.runs,
                                                "celery" in names)
                loaded = latency_load.measure_if(opts.latency_load, opts.runs,
                                                 "celery" in names, Path(tmp) / "latency")
                starts = bench_startup.measure_if(opts.startup, opts.runs)
        except KeyboardInterrupt:
            console.print("[yellow]interrupted; workers and drivers stopped[/]")
            return 130
        except BenchError as exc:
            console.print(f"[red]{exc}[/]")
            return 1
    console.print(report(outcomes, opts))
    details(outcomes, opts)
    ratios = ratio_table(outcomes, opts)
    if ratios is not None:
        console.print(ratios)
        celery = next((o for o in outcomes if o.system.key == "celery" and o.runs), None)
        if celery is not None:
            mine = {k: celery.median(m) for k, m in (
                ("enqueue", lambda r: r.enqueue), ("drain", lambda r: r.drain),
                ("p50", lambda r: r.p50))}
            console.print(
                f"[dim]Celery when the targets were set: {REFERENCE['enqueue']:,.0f} enqueues/s, "
                f"{REFERENCE['drain']:,.0f} drained/s, {REFERENCE['p50'] * 1e3:.1f} ms p50; "
                f"in this run: {mine['enqueue'] or 0:,.0f}, {mine['drain'] or 0:,.0f}, "
                f"{(mine['p50'] or 0) * 1e3:.2f} ms. Targets are judged against this run.[/]")
    sleep = sleep_table(outcomes)
    if sleep is not None:
        console.print(sleep)
    canvas_failed = canvas_failures(outcomes)
    events_cost(outcomes)
    flow.fair_cost(outcomes)
    pool_ratios(outcomes)
    if overhead is not None:
        console.print(
            f"prefork pool overhead per task: {overhead['pool_us']:.1f} us; raw pipe round "
            f"trip between two Python processes: {overhead['raw_us']:.1f} us; ratio "
            f"{overhead['ratio']:.2f}x (target <= 3x)")
    if soak:
        console.print(soak)
    console.print("\n".join(broker_mem), end="\n" if broker_mem else "")
    flow.show(unique)
    if pings is not None:
        console.print(control_ping.table(pings))
    bench_outbox.show(outbox)
    producers.show(threaded)
    latency_load.show(loaded)
    bench_startup.show(starts)
    console.print(f"[dim]total {time.monotonic() - began:.0f}s[/]")
    return 1 if canvas_failed or any(o.error for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
