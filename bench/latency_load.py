"""Latency under load: producers send at half of the worker's measured maximum drain, on
a schedule, and each task stamps how long after its ``delay()`` it started
(``bench/run.py --latency-load``; alone: ``python bench/latency_load.py``).

Per system (celeriac, Celery), one Redis, a worker of 2 prefork processes, and the task
``bench.stamp(sent_at, key)``: at its start it pushes ``time.time() - sent_at`` to a
list on the I/O database (12), one Redis round trip, no result stored. Per run:

1. maximum drain: ``--drain-n`` stamp tasks queued, the worker started, timed from its
   ready signal until every one has pushed its stamp;
2. the same worker, idle, then ``--threads`` producer threads send at half that rate
   for ``--seconds`` (open loop: each send at its scheduled time, or at once when the
   sender is late; never waiting on a result), each stamping ``time.time()`` into the
   task's arguments just before its ``delay()``;
3. once every stamp is in, p50 / p99 / max of the stamps (from ``delay()`` to the
   task's start: the producer's publish, the broker, the worker's fetch and prefetch
   and the pool's hand-off), and how many tasks started per second while the producers
   sent: under the rate sent, the worker fell behind. With ``--load 1`` that is the
   worker's pace with the producers beside it on the same CPUs.

celeriac's producer runs in this process; Celery's in ``bench/.venv-celery``, this file
run there with ``--peer celery``. The worker imports this module too (``-A
latency_load`` for celeriac, ``--include latency_load`` for Celery), which then
registers the stamp task on that side's app (``BENCH_LATENCY_SIDE``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from idle_path import cpu

HERE = Path(__file__).resolve().parent
STAMP = "bench.stamp"
SIDE = os.environ.get("BENCH_LATENCY_SIDE")


def pace(send: Callable[[float], object], rate: float, seconds: float, threads: int) -> int:
    """``send(time.time())`` at ``rate`` per second in all, for ``seconds``, from
    ``threads`` threads (thread ``i`` takes every ``threads``-th slot of the schedule);
    returns how many were sent. Raises the first error a sender met."""
    start = time.perf_counter() + 0.05
    total = int(rate * seconds)
    sent = [0] * threads
    errors: list[BaseException] = []

    def sender(i: int) -> None:
        clock = time.perf_counter
        try:
            for k in range(i, total, threads):
                wait = start + k / rate - clock()
                if wait > 0:
                    time.sleep(wait)
                send(time.time())
                sent[i] += 1
        except BaseException as exc:  # reported by the caller below
            errors.append(exc)

    workers = [threading.Thread(target=sender, args=(i,), name=f"paced-{i}")
               for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    if errors:
        raise errors[0]
    return sum(sent)


# -- the worker's side: the stamp task on whichever app imports this module ----------------

def celeriac_stamp(app: Any) -> Any:
    """The stamp task on a celeriac app (the worker's, and the bench's for its delay())."""
    import tasks as bench_tasks

    @app.task(name=STAMP, ignore_result=True)
    def stamp(sent_at: float, key: str) -> None:
        started = time.time()
        bench_tasks.io_client().rpush(key, started - sent_at)

    return stamp


if SIDE == "celeriac":
    import tasks as _bench_tasks

    app = _bench_tasks.app  # ``celeriac -A latency_load worker``: the CELERIAC_* app
    celeriac_stamp(app)
elif SIDE == "celery":
    # Celery's virtualenv (``--include latency_load``, or ``--peer celery``): no celeriac.
    import celery_app as _celery_app
    import peerlib as _peerlib

    @_celery_app.app.task(name=STAMP, ignore_result=True)
    def _celery_stamp(sent_at: float, key: str) -> None:
        started = time.time()
        _peerlib.io_client().rpush(key, started - sent_at)


def peer_main(opts: argparse.Namespace) -> dict[str, Any]:
    """Celery's producer (``--peer celery``, in Celery's virtualenv)."""
    delay = _celery_app.app.tasks[STAMP].delay
    key = opts.key
    if opts.enqueue:
        for _ in range(opts.enqueue):
            delay(0.0, key)
        return {"sent": opts.enqueue}
    for _ in range(50):  # connections opened before the schedule starts
        delay(time.time(), key + ":warm")
    return {"sent": pace(lambda now: delay(now, key), opts.paced, opts.seconds, opts.threads)}


# -- the bench's side ----------------------------------------------------------------------

def percentiles(stamps: list[float]) -> dict[str, float]:
    ordered = sorted(stamps)

    def at(q: float) -> float:
        return ordered[min(int(q * len(ordered)), len(ordered) - 1)]

    return {"p50": at(0.50), "p99": at(0.99), "max": ordered[-1], "count": len(ordered)}

class Side:
    """One system under test: its worker, its producer, its broker database."""

    name: str
    worker: Any = None

    def enqueue(self, n: int, key: str) -> None:
        raise NotImplementedError

    def paced(self, rate: float, seconds: float, threads: int, key: str) -> int:
        raise NotImplementedError

    def start_worker(self, workdir: Path, deadline: float) -> float:
        raise NotImplementedError

    def flush(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        worker, self.worker = self.worker, None
        if worker is not None:
            worker.stop()

    def close(self) -> None:
        """Release the producer's connections."""


class CeleriacSide(Side):
    name = "celeriac"

    def __init__(self) -> None:
        import tasks as bench_tasks
        from harness import CELERIAC_REDIS_URL

        self.url = CELERIAC_REDIS_URL
        self.app, _ = bench_tasks.make_app(self.url)
        self.stamp = celeriac_stamp(self.app)

    def enqueue(self, n: int, key: str) -> None:
        delay = self.stamp.delay
        for _ in range(n):
            delay(0.0, key)

    def paced(self, rate: float, seconds: float, threads: int, key: str) -> int:
        delay = self.stamp.delay
        pace(lambda now: delay(now, key + ":warm"), 500, 0.1, threads)  # connections open
        return pace(lambda now: delay(now, key), rate, seconds, threads)

    def start_worker(self, workdir: Path, deadline: float) -> float:
        from harness import WorkerProcess

        exe = Path(sys.executable).with_name("celeriac")
        argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "celeriac"]
        argv += ["-A", "latency_load", "worker", "--pool", "prefork", "-c", "2",
                 "-l", "warning"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("CELERIAC_")}
        env.update(CELERIAC_BROKER_URL=self.url, BENCH_LATENCY_SIDE="celeriac",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")])))
        self.worker = WorkerProcess(argv, env, workdir, workdir / "celeriac-worker.log")
        ready: float = self.worker.start(deadline)
        return ready

    def flush(self) -> None:
        from harness import CELERIAC_REDIS_DB, flush_redis_db

        flush_redis_db(CELERIAC_REDIS_DB)

    def close(self) -> None:
        self.app.close()


class CelerySide(Side):
    name = "celery"

    def __init__(self, timeout: float) -> None:
        from harness import PEERS
        from peer_systems import PeerSystem

        self.peer = PeerSystem(PEERS["celery"])
        self.peer.venv.ensure(timeout=600)
        self.env = self.peer.env()
        self.env.update(BENCH_LATENCY_SIDE="celery",
                        PYTHONPATH=os.pathsep.join([self.env["PYTHONPATH"], str(HERE)]))
        self.timeout = timeout

    def _producer(self, *args: str, within: float) -> dict[str, Any]:
        from harness import PEERS_DIR, BenchError

        try:
            done = subprocess.run([str(self.peer.venv.python), str(Path(__file__).resolve()),
                                   "--peer", "celery", *args], env=self.env, cwd=PEERS_DIR,
                                  capture_output=True, timeout=within, check=False)
        except subprocess.TimeoutExpired:
            raise BenchError(f"Celery's producer did not finish in {within:.0f}s") from None
        if done.returncode != 0:
            raise BenchError(f"Celery's producer failed: {done.stderr.decode()[-2000:]}")
        reply: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
        return reply

    def enqueue(self, n: int, key: str) -> None:
        self._producer("--enqueue", str(n), "--key", key, within=self.timeout)

    def paced(self, rate: float, seconds: float, threads: int, key: str) -> int:
        return int(self._producer("--paced", str(rate), "--seconds", str(seconds),
                                  "--threads", str(threads), "--key", key,
                                  within=seconds + self.timeout)["sent"])

    def start_worker(self, workdir: Path, deadline: float) -> float:
        from harness import PEERS_DIR, WorkerProcess

        argv = [str(self.peer.venv.path / "bin" / "celery"), "-A", "celery_app", "worker",
                "--pool", "prefork", "-c", "2", "-l", "warning", "--include", "latency_load"]
        self.worker = WorkerProcess(argv, self.env, PEERS_DIR, workdir / "celery-worker.log")
        ready: float = self.worker.start(deadline)
        return ready

    def flush(self) -> None:
        from harness import PEERS, flush_redis_db

        flush_redis_db(PEERS["celery"].redis_db)


def _wait_count(io: Any, key: str, n: int, timeout: float, side: Side) -> float:
    """The unix time ``key`` first held ``n`` stamps (polled every 5 ms)."""
    from harness import BenchError

    deadline = time.monotonic() + timeout
    polls = 0
    while io.llen(key) < n:
        if time.monotonic() >= deadline:
            raise BenchError(f"{side.name}: {io.llen(key)} of {n} stamps after {timeout:.0f}s")
        polls += 1
        if polls % 200 == 0 and side.worker is not None:
            side.worker.check_alive("mid-run")
        time.sleep(0.005)
    return time.time()


def worker_cpu(side: Side) -> tuple[float, float]:
    """CPU seconds so far of the worker's main process and of its children, every thread
    (``/proc/<pid>/task/*/schedstat``: nanoseconds, finer than ``stat``'s ticks)."""
    proc = getattr(side.worker, "proc", None)
    if proc is None:
        return 0.0, 0.0

    try:
        kids: list[int] = []
        for tid in os.listdir(f"/proc/{proc.pid}/task"):
            with open(f"/proc/{proc.pid}/task/{tid}/children") as f:
                kids += [int(x) for x in f.read().split()]
        return cpu(proc.pid), sum(cpu(k) for k in kids)
    except OSError:  # no /proc (not Linux), or a child replaced mid-read
        return 0.0, 0.0


def one_run(side: Side, opts: argparse.Namespace, workdir: Path) -> dict[str, float]:
    import redis
    import tasks as bench_tasks

    io = redis.Redis.from_url(bench_tasks.IO_URL)
    key = f"bench:latency:{uuid.uuid4().hex[:8]}"
    side.flush()
    try:
        side.enqueue(opts.drain_n, key)
        ready = side.start_worker(workdir, time.monotonic() + 60)
        drain = opts.drain_n / (_wait_count(io, key, opts.drain_n, opts.timeout, side) - ready)
        io.delete(key)
        rate = drain * opts.load
        cpu_before = worker_cpu(side)
        began = time.perf_counter()
        sent = side.paced(rate, opts.seconds, opts.threads, key)
        sending = time.perf_counter() - began
        # Started while sending: under the rate sent when the worker fell behind (with
        # --load 1, its pace with the producer beside it on the same CPUs).
        done_rate = io.llen(key) / sending
        _wait_count(io, key, sent, opts.timeout, side)
        cpu_after = worker_cpu(side)
        stamps = [float(x) for x in io.lrange(key, 0, -1)]
    finally:
        side.stop()
        io.delete(key, key + ":warm")
        io.close()
        side.flush()
    # Per paced task (the warm-up's few calls included): what trickling tasks cost the
    # worker, against the drain's cost per task (docs/speed.md, "Latency under load").
    main_us, children_us = ((a - b) / max(sent, 1) * 1e6
                            for a, b in zip(cpu_after, cpu_before, strict=True))
    return {"drain": drain, "rate": rate, "sent_rate": sent / sending, "done_rate": done_rate,
            **percentiles(stamps),
            "main_us": main_us, "children_us": children_us}


def measure(opts: argparse.Namespace, workdir: Path) -> dict[str, dict[str, float]]:
    """Per system: medians over the runs (systems interleaved within each run)."""
    from harness import require_redis

    require_redis()
    sides: list[Side] = [CeleriacSide()]
    if opts.peers:
        sides.append(CelerySide(opts.timeout))
    samples: dict[str, list[dict[str, float]]] = {s.name: [] for s in sides}
    try:
        for _ in range(opts.runs):
            for side in sides:
                samples[side.name].append(one_run(side, opts, workdir))
    finally:
        for side in sides:
            side.stop()
            side.close()
    return {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            | {"p99_worst": max(r["p99"] for r in runs)}
            | {f"p99_{i}": r["p99"] for i, r in enumerate(runs)}
            for name, runs in samples.items()}


def table(figures: dict[str, dict[str, float]], opts: argparse.Namespace) -> Any:
    from rich.table import Table

    t = Table(title=f"latency under load: delay() to the task's start, sending at "
                    f"{opts.load:.0%} of each system's maximum drain for {opts.seconds:g} s "
                    f"(median of {opts.runs} runs)", title_justify="left")
    for column in ("system", "max drain /s", "sent /s", "started /s while sending", "p50 ms",
                   "p99 ms", "max ms",
                   "worst p99 ms", "each run's p99 ms", "CPU us/task main / children"):
        t.add_column(column, justify="left" if column == "system" else "right")
    for name, f in figures.items():
        each = " ".join(f"{v * 1e3:.1f}" for k, v in f.items()
                        if k.startswith("p99_") and k != "p99_worst")
        t.add_row(name, f"{f['drain']:,.0f}", f"{f['sent_rate']:,.0f}",
                  f"{f.get('done_rate', 0):,.0f}", f"{f['p50'] * 1e3:.2f}",
                  f"{f['p99'] * 1e3:.2f}", f"{f['max'] * 1e3:.1f}",
                  f"{f['p99_worst'] * 1e3:.2f}", each,
                  f"{f.get('main_us', 0):,.0f} / {f.get('children_us', 0):,.0f}")
    return t


def options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0,
                        help="paced sending per run (default 30)")
    parser.add_argument("--drain-n", type=int, default=5000,
                        help="tasks of the maximum-drain measurement (default 5000)")
    parser.add_argument("--threads", type=int, default=4,
                        help="producer threads sharing the schedule (default 4)")
    parser.add_argument("--load", type=float, default=0.5,
                        help="fraction of the measured maximum drain to send at (default 0.5)")
    parser.add_argument("--runs", type=int, default=3, help="runs (default 3)")
    parser.add_argument("--no-peers", dest="peers", action="store_false", help="celeriac only")
    parser.add_argument("--peer", choices=["celery"], help=argparse.SUPPRESS)
    parser.add_argument("--key", help=argparse.SUPPRESS)
    parser.add_argument("--enqueue", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--paced", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="deadline in seconds for each wait (default 600)")
    return parser.parse_args(argv)


def measure_if(wanted: bool, runs: int, peers: bool, workdir: Path
               ) -> tuple[dict[str, dict[str, float]], argparse.Namespace] | None:
    """``bench/run.py --latency-load``'s figures (this file's defaults), else None."""
    if not wanted:
        return None
    opts = options(["--runs", str(min(runs, 3)), *([] if peers else ["--no-peers"])])
    workdir.mkdir(parents=True, exist_ok=True)
    return measure(opts, workdir), opts


def show(figures: tuple[dict[str, dict[str, float]], argparse.Namespace] | None) -> None:
    if figures is not None:
        from harness import console

        console.print(table(*figures))


def main(argv: list[str] | None = None) -> int:
    opts = options(argv)
    if opts.peer == "celery":
        print(json.dumps(peer_main(opts)))
        return 0
    if (opts.seconds <= 0 or opts.drain_n < 100 or opts.threads < 1 or opts.runs < 1
            or not 0 < opts.load <= 1):
        print("--seconds > 0, --drain-n >= 100, --threads >= 1, --runs >= 1, "
              "0 < --load <= 1", file=sys.stderr)
        return 2
    import tempfile

    from harness import BenchError, console, machine_lock, terminate_as_interrupt

    try:
        with terminate_as_interrupt(), machine_lock(600), \
                tempfile.TemporaryDirectory(prefix="celeriac-latency-") as tmp:
            figures = measure(opts, Path(tmp))
    except BenchError as exc:
        console.print(f"[red]{exc}[/]")
        return 1
    console.print(table(figures, opts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
