"""Many-threaded producers: ``delay()`` per second from 1 thread and from 16 at once (a web
server's threads), celeriac against Celery (``bench/run.py`` prints it; alone:
``python bench/producers.py``).

No worker runs: what is measured is the callers' side, every ``delay()`` returning only
once the broker has confirmed its message (celeriac: the publish script's reply, shared
by the callers whose messages went in that round trip, ``producer/batching.py``;
Celery: its LPUSH's reply). celeriac runs in this process on the bench's Redis database
(15); Celery in ``bench/.venv-celery`` (made on first use), this file run there with
``--peer celery``, on its database (14). Each run measures 1 thread then 16 threads of
each system in turn (``--n`` calls each time, split between the threads), and the
ratio 16/1 of each system comes from one run; figures are medians of the runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
THREADS = (1, 16)
WARMUP = 200


def rate(delay: Callable[[], object], threads: int, n: int) -> float:
    """Calls per second of ``delay`` from ``threads`` threads started together, ``n``
    calls in all. Raises the first error a thread met."""
    per = max(n // threads, 1)
    barrier = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def work() -> None:
        barrier.wait()
        try:
            for _ in range(per):
                delay()
        except BaseException as exc:  # reported by the caller below, not lost in a thread
            errors.append(exc)

    workers = [threading.Thread(target=work, name=f"producer-{i}") for i in range(threads)]
    for t in workers:
        t.start()
    barrier.wait()
    began = time.perf_counter()
    for t in workers:
        t.join()
    elapsed = time.perf_counter() - began
    if errors:
        raise errors[0]
    return per * threads / elapsed


def measure_rates(delay: Callable[[], object], n: int) -> dict[str, float]:
    for _ in range(WARMUP):
        delay()
    rate(delay, 16, 16 * 20)  # every thread's connection opened before the timing
    return {str(t): rate(delay, t, n) for t in THREADS}


def peer_celery(n: int) -> dict[str, float]:
    """Celery's figures, in Celery's virtualenv (``--peer celery``)."""
    # Only in that virtualenv, which has Celery and not celeriac: imported here.
    import celery_app

    app, noop = celery_app.make_app()
    try:
        return measure_rates(noop.delay, n)
    finally:
        app.close()


def celeriac_run(n: int) -> dict[str, float]:
    import tasks as bench_tasks
    from harness import CELERIAC_REDIS_DB, CELERIAC_REDIS_URL, flush_redis_db

    app, noop = bench_tasks.make_app(CELERIAC_REDIS_URL)
    try:
        return measure_rates(noop.delay, n)
    finally:
        app.close()
        flush_redis_db(CELERIAC_REDIS_DB)


def celery_run(n: int, timeout: float) -> dict[str, float]:
    from harness import PEERS, BenchError, flush_redis_db
    from peer_systems import PeerSystem

    peer = PeerSystem(PEERS["celery"])
    peer.venv.ensure(timeout=600)
    try:
        done = subprocess.run(
            [str(peer.venv.python), str(Path(__file__).resolve()), "--peer", "celery",
             "--n", str(n)], env=peer.env(), cwd=HERE / "peers", capture_output=True,
            timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise BenchError(f"Celery's producers did not finish within {timeout:.0f}s") from None
    finally:
        flush_redis_db(PEERS["celery"].redis_db)
    if done.returncode != 0:
        raise BenchError(f"Celery's producers failed: {done.stderr.decode()[-2000:]}")
    figures: dict[str, float] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return figures


def measure(n: int = 4000, runs: int = 3, peers: bool = True,
            timeout: float = 300.0) -> dict[str, dict[str, float]]:
    """Per system: delay()/s with each thread count and the ratio 16/1 (medians)."""
    from harness import require_redis

    require_redis()
    systems: dict[str, Callable[[], dict[str, float]]] = {
        "celeriac": lambda: celeriac_run(n)}
    if peers:
        systems["celery"] = lambda: celery_run(n, timeout)
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in systems}
    for _ in range(runs):
        for name, run in systems.items():  # interleaved: a drifting load weighs alike
            one = run()
            one["ratio"] = one["16"] / one["1"]
            samples[name].append(one)
    return {name: {key: statistics.median(s[key] for s in runs_)
                   for key in ("1", "16", "ratio")}
            | {"ratio_min": min(s["ratio"] for s in runs_)}
            | {f"ratio_{i}": s["ratio"] for i, s in enumerate(runs_)}
            for name, runs_ in samples.items()}


def table(figures: dict[str, dict[str, float]]) -> Any:
    from rich.table import Table

    t = Table(title="many-threaded producers: delay()/s, every call confirmed by the broker "
                    "(median of runs; ratio from each run)", title_justify="left")
    for column in ("system", "1 thread", "16 threads", "16 / 1", "lowest", "each run"):
        t.add_column(column, justify="left" if column == "system" else "right")
    for name, f in figures.items():
        each = " ".join(f"{v:.2f}" for k, v in f.items() if k.startswith("ratio_")
                        and k != "ratio_min")
        t.add_row(name, f"{f['1']:,.0f}", f"{f['16']:,.0f}", f"{f['ratio']:.2f}x",
                  f"{f['ratio_min']:.2f}x", each)
    if "celery" in figures and "celeriac" in figures:
        t.caption = (f"celeriac / Celery with 16 threads: "
                     f"{figures['celeriac']['16'] / figures['celery']['16']:.1f}x")
    return t


def measure_if(wanted: bool, n: int, runs: int, peers: bool) -> dict[str, dict[str, float]] | None:
    """``bench/run.py``'s figures (at most 4,000 calls a measurement, 3 runs)."""
    return measure(min(n, 4000), min(runs, 3), peers) if wanted else None


def show(figures: dict[str, dict[str, float]] | None) -> None:
    if figures is not None:
        from harness import console

        console.print(table(figures))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=4000,
                        help="delay() calls per measurement (default 4000)")
    parser.add_argument("--runs", type=int, default=3, help="runs (default 3)")
    parser.add_argument("--no-peers", dest="peers", action="store_false",
                        help="celeriac only")
    parser.add_argument("--peer", choices=["celery"], help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.n < 16 or opts.runs < 1:
        parser.error("--n must be >= 16 and --runs >= 1")
    if opts.peer == "celery":
        print(json.dumps(peer_celery(opts.n)))
        return 0
    from harness import BenchError, console, machine_lock

    try:
        with machine_lock(600):
            figures = measure(opts.n, opts.runs, opts.peers)
    except BenchError as exc:
        console.print(f"[red]{exc}[/]")
        return 1
    console.print(table(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
