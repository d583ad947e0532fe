"""``inspect ping`` latency: celeriac against Celery on the same Redis (``bench/run.py
--ping``, or ``python bench/control_ping.py``).

For 1 and 5 workers of each system (solo pool, ``--without-mingle``, otherwise
defaults) the bench times ``app.control.ping(timeout=2, limit=N)``: from the call to the
moment every worker's reply is in (``limit`` ends the wait there). 50 pings after 5
untimed ones; p50 and p99 in milliseconds. Celery's side is its driver's ``ping``
command (``peers/celery_driver.py``) in ``bench/.venv-celery``, on Redis database 14;
celeriac's is this process, on database 15.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tasks as bench_tasks
from harness import (
    CELERIAC_REDIS_DB,
    CELERIAC_REDIS_URL,
    HERE,
    PEERS,
    PEERS_DIR,
    BenchError,
    WorkerProcess,
    console,
    flush_redis_db,
    machine_lock,
    percentile,
    require_redis,
)
from peer_systems import PeerSystem

WORKERS = (1, 5)
PINGS = 50
WARMUP = 5
TIMEOUT = 2.0


def celeriac_pings(n: int, pings: int, workdir: Path) -> list[float]:
    require_redis()
    flush_redis_db(CELERIAC_REDIS_DB)
    url = CELERIAC_REDIS_URL
    exe = Path(sys.executable).with_name("celeriac")
    base = [str(exe)] if exe.exists() else [sys.executable, "-m", "celeriac"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERIAC_")}
    env.update(CELERIAC_BROKER_URL=url,
               PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")])))
    workers = [WorkerProcess([*base, "-A", "tasks", "worker", "--pool", "solo", "-n",
                              f"p{i}@bench", "-l", "warning", "--without-mingle"],
                             env, workdir, workdir / f"celeriac-ping{i}.log")
               for i in range(n)]
    app, _ = bench_tasks.make_app(url)
    try:
        for w in workers:
            w.start(time.monotonic() + 60)
        return _time(lambda: len(app.control.ping(timeout=TIMEOUT, limit=n)), n, pings)
    finally:
        app.close()
        for w in workers:
            w.stop()


def _time(call: object, n: int, pings: int) -> list[float]:
    assert callable(call)
    samples = []
    for i in range(WARMUP + pings):
        t0 = time.perf_counter()
        got = call()
        elapsed = time.perf_counter() - t0
        if got != n:
            raise BenchError(f"ping: {got} of {n} workers replied within {TIMEOUT}s")
        if i >= WARMUP:
            samples.append(elapsed)
    return samples


def celery_pings(n: int, pings: int, workdir: Path) -> list[float]:
    peer = PEERS["celery"]
    system = PeerSystem(peer)
    system.setup(workdir)
    workers = []
    try:
        argv = [str(system.venv.path / "bin" / "celery"), "-A", "celery_app", "worker",
                "--pool", "solo", "-l", "warning", "--without-mingle"]
        for i in range(n):
            w = WorkerProcess([*argv, "-n", f"p{i}@bench"], system.env(),
                              PEERS_DIR, workdir / f"celery-ping{i}.log")
            workers.append(w)
            w.start(time.monotonic() + 60)
        assert system.driver is not None
        reply = system.driver.call("ping", 120, n=n, count=pings, warmup=WARMUP,
                                   timeout=TIMEOUT)
        samples: list[float] = reply["samples"]
        return samples
    finally:
        for w in workers:
            w.stop()
        if system.driver is not None:
            system.driver.close()


def measure(systems: list[str], counts: tuple[int, ...], pings: int, root: Path
            ) -> dict[tuple[str, int], list[float] | str]:
    out: dict[tuple[str, int], list[float] | str] = {}
    for n in counts:
        for name in systems:
            workdir = root / f"{name}-{n}"
            workdir.mkdir(parents=True, exist_ok=True)
            fn = celeriac_pings if name == "celeriac" else celery_pings
            try:
                out[name, n] = fn(n, pings, workdir)
            except BenchError as exc:
                out[name, n] = str(exc)
    return out


def table(results: dict[tuple[str, int], list[float] | str]) -> Table:
    t = Table(title="inspect ping: time to every worker's reply (limit=N), ms")
    for col in ("system", "workers", "p50", "p99", "mean"):
        t.add_column(col, justify="left" if col == "system" else "right")
    for (name, n), samples in results.items():
        if isinstance(samples, str):
            t.add_row(name, str(n), "failed", "", samples[:60])
            continue
        t.add_row(name, str(n), f"{percentile(samples, 50) * 1e3:.2f}",
                  f"{percentile(samples, 99) * 1e3:.2f}",
                  f"{statistics.fmean(samples) * 1e3:.2f}")
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", default="celeriac,celery")
    parser.add_argument("--pings", type=int, default=PINGS)
    parser.add_argument("--workers", default=",".join(map(str, WORKERS)))
    opts = parser.parse_args(argv)
    systems = [s.strip() for s in opts.systems.split(",") if s.strip()]
    counts = tuple(int(c) for c in opts.workers.split(","))
    with tempfile.TemporaryDirectory(prefix="celeriac-ping-") as tmp, \
            machine_lock(600):
        results = measure(systems, counts, opts.pings, Path(tmp))
    console.print(table(results))
    return 1 if any(isinstance(v, str) for v in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
