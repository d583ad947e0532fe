"""The worker's idle path, per task: what one ``delay().get()`` on an idle worker costs
(``rt``), and what a task that trickles in costs (``paced``: a stamp task sent on a
schedule, no result stored, as in ``latency_load.py``), in CPU of the worker's main
process, its children and Redis, context switches of the main process, and Redis
commands (``docs/speed.md``, "The round trip, hop by hop").

It starts a redis-server of its own (on a free port; none of the shared server's other
clients counted) and a worker (prefork -c 2) on it, and reads ``/proc/<pid>/task/*/
schedstat`` (CPU time in ns, finer than the clock ticks of ``stat``) before and after.
Compare two trees by running it alternately under each (``PYTHONPATH=<tree>/src``),
interleaved, several times: wall times on a loaded machine are noise, CPU per task and
counts much less so. ``--strace FILE`` adds ``strace -c`` of the main process's loop
thread over the timed part (it slows the worker: read its counts, not its times).

    python bench/idle_path.py rt --n 400
    python bench/idle_path.py paced --rate 300 --seconds 5
    python bench/idle_path.py drain --n 20000

``drain``: the busy path for comparison, ``bench/run.py``'s I/O drain (one INCR per task,
no result) of preloaded tasks, per task between 10% and 90% done; with each process's wait
for a CPU per task (``*_wait_us``), its share of the time asleep (``*_asleep``: a child
waiting for Redis's reply or for its next job) and the CPUs the worker and Redis kept busy
(``busy_cpus``). ``--prefetch-multiplier`` sets the worker's window (docs/speed.md, "Where
the targets stand", fifth session); ``--callgrind`` gives instead the worker's main
process's instructions per task, a count that holds still on a busy machine.
``caller_us`` (``rt``):
the CPU of this process, which calls ``delay().get()``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
COUNTED = ("evalsha", "blpop", "xread", "mget", "rpush")

if os.environ.get("BENCH_IDLE_URL"):  # the worker's side: ``-A idle_path``
    from celeriac import Celeriac, Settings

    _url = os.environ["BENCH_IDLE_URL"]
    app = Celeriac("idle", settings=Settings(
        broker_url=_url, result_backend=_url,
        worker_prefetch_multiplier=int(os.environ.get("BENCH_IDLE_PREFETCH", "4"))))
    _io: Any = None

    @app.task(name="idle.noop")
    def noop() -> None:
        return None

    @app.task(name="idle.io", ignore_result=True)
    def io(key: str) -> None:
        global _io
        if _io is None:
            import redis

            _io = redis.Redis.from_url(_url.split("?")[0])
        _io.incr(key)

    @app.task(name="idle.io_stored")
    def io_stored(key: str) -> None:
        io(key)

    @app.task(name="idle.stamp", ignore_result=True)
    def stamp(sent_at: float, key: str) -> None:
        global _io
        started = time.time()
        if _io is None:
            import redis

            _io = redis.Redis.from_url(_url.split("?")[0])
        _io.rpush(key, started - sent_at)


def cpu(pid: int) -> float:
    """Seconds on a CPU of every thread of ``pid``."""
    return sched(pid)[0]


def sched(pid: int) -> tuple[float, float]:
    """Seconds on a CPU, and seconds runnable but waiting for one, of every thread of
    ``pid`` (``schedstat``'s first two fields)."""
    ran = waited = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            fields = f.read().split()
        ran += int(fields[0])
        waited += int(fields[1])
    return ran / 1e9, waited / 1e9


def switches(pid: int) -> int:
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            total += sum(int(line.split()[1]) for line in f
                         if line.startswith(("voluntary_ctxt", "nonvoluntary_ctxt")))
    return total


def children(pid: int) -> list[int]:
    out: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            out += [int(x) for x in f.read().split()]
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_worker(opts: argparse.Namespace, env: dict[str, str], workdir: Path
                 ) -> subprocess.Popen[bytes]:
    # Under callgrind the worker's main process counts its instructions (its children
    # are forked, so they run under it too, and as slowly).
    valgrind = ["valgrind", "--tool=callgrind", "--dump-instr=no",
                f"--callgrind-out-file={workdir}/callgrind.%p"] if opts.callgrind else []
    with open(workdir / "worker.log", "ab") as log:
        return subprocess.Popen(
            [*valgrind, sys.executable, "-m", "celeriac", "-A", "idle_path", "worker", "-P",
             "prefork", "-c", "2", "-l", "warning", "--without-heartbeat",
             "--without-gossip", "--without-mingle"],
            env=env, stdout=subprocess.DEVNULL, stderr=log)


def measure(opts: argparse.Namespace, port: int, workdir: Path) -> dict[str, Any]:
    import redis

    url = f"redis://127.0.0.1:{port}/0?namespace=i{uuid.uuid4().hex[:6]}"
    os.environ["BENCH_IDLE_URL"] = url
    sys.path.insert(0, str(HERE))
    import idle_path as side  # the tasks, on this process's app too

    admin = redis.Redis(port=port)
    redis_pid = int(admin.info("server")["process_id"])
    if opts.mode == "drain":
        key = f"io:{uuid.uuid4().hex}"
        (side.io_stored if opts.results else side.io).delay_many([(key,)] * opts.n)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    worker = start_worker(opts, env, workdir)
    try:
        if opts.mode == "drain":
            return instructions(opts, worker, admin, key, workdir) if opts.callgrind \
                else drain(opts, worker, admin, redis_pid, key)
        side.noop.delay().get(timeout=60)
        pids = [worker.pid, *children(worker.pid), redis_pid]
        key = f"stamps:{uuid.uuid4().hex}"
        for _ in range(20):  # warm: connections, scripts loaded
            side.noop.delay().get(timeout=10)
        tracer = None
        if opts.strace:
            tracer = subprocess.Popen(["strace", "-c", "-p", str(worker.pid), "-o",
                                       opts.strace], stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # attached
        admin.config_resetstat()
        before = [cpu(p) for p in pids] + [switches(worker.pid)]
        caller = time.process_time()
        if opts.mode == "rt":
            n, waits = opts.n, []
            for _ in range(n):
                t = time.perf_counter()
                side.noop.delay().get(timeout=10)
                waits.append(time.perf_counter() - t)
                if opts.pause:
                    time.sleep(opts.pause)  # sleep-ok: idle again, the worker in its BLPOP
        else:
            n = int(opts.rate * opts.seconds)
            start = time.perf_counter() + 0.05
            for k in range(n):
                wait = start + k / opts.rate - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                side.stamp.delay(time.time(), key)
            deadline = time.monotonic() + 120
            io = redis.Redis(port=port)
            while io.llen(key) < n and time.monotonic() < deadline:
                time.sleep(0.01)
            waits = [float(x) for x in io.lrange(key, 0, -1)]
            io.delete(key)
        after = [cpu(p) for p in pids] + [switches(worker.pid)]
        caller = time.process_time() - caller
        if tracer is not None:
            tracer.send_signal(signal.SIGINT)
            tracer.wait()
        stats = admin.info("commandstats")
    finally:
        worker.terminate()
        worker.wait(30)
    per = [(a - b) / n for a, b in zip(after, before, strict=True)]
    waits.sort()
    return {"tasks": n, "p50_ms": waits[len(waits) // 2] * 1e3,
            "p99_ms": waits[int(len(waits) * 0.99)] * 1e3,
            "main_us": per[0] * 1e6, "children_us": sum(per[1:-2]) * 1e6,
            "redis_us": per[-2] * 1e6, "caller_us": caller / n * 1e6,
            "main_switches": per[-1],
            **{name: stats.get(f"cmdstat_{name}", {}).get("calls", 0) / n
               for name in COUNTED},
            "load": float(open("/proc/loadavg").read().split()[0])}


def done_at_least(admin: Any, key: str, count: float, n: int, deadline: float,
                  poll: float) -> int:
    """The drain's counter once it reaches ``count`` (of ``n``), polled every ``poll``
    seconds; RuntimeError past ``deadline`` (monotonic)."""
    while (done := int(admin.get(key) or 0)) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"drain stuck at {done} of {n}")
        time.sleep(poll)
    return done


def drain(opts: argparse.Namespace, worker: subprocess.Popen[bytes], admin: Any,
          redis_pid: int, key: str) -> dict[str, Any]:
    """The I/O drain of ``opts.n`` preloaded tasks (one INCR each, no result), measured
    between 10% and 90% done: past the worker's start, before the tail."""
    n = opts.n

    def done() -> int:
        return int(admin.get(key) or 0)

    deadline = time.monotonic() + 300
    marks: list[tuple[float, list[float], int]] = []
    waits: list[list[float]] = []
    calls: list[int] = []
    for frac in (0.1, 0.9):
        done_at_least(admin, key, n * frac, n, deadline, 0.002)
        pids = [worker.pid, *children(worker.pid), redis_pid]
        times = [sched(p) for p in pids]
        marks.append((time.perf_counter(), [t[0] for t in times] + [switches(worker.pid)],
                      done()))
        waits.append([t[1] for t in times])
        calls.append(int(admin.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)))
    (t0, before, d0), (t1, after, d1) = marks
    count, wall = d1 - d0, t1 - t0
    per = [(a - b) / count for a, b in zip(after, before, strict=True)]
    queued = [(a - b) / count for a, b in zip(waits[1], waits[0], strict=True)]
    # What is neither on a CPU nor waiting for one is asleep: a child waiting for its
    # task's reply from Redis or for its next job, the main process for the children
    # or Redis. A CPU is idle whenever fewer than two of these processes are runnable.
    asleep = [1 - (ran + wait) * count / wall for ran, wait in zip(per[:-1], queued, strict=True)]
    kids = len(pids) - 2
    return {"tasks": count, "rate": count / wall, "main_us": per[0] * 1e6,
            "children_us": sum(per[1:-2]) * 1e6, "redis_us": per[-2] * 1e6,
            "main_wait_us": queued[0] * 1e6, "children_wait_us": sum(queued[1:-1]) * 1e6,
            "redis_wait_us": queued[-1] * 1e6, "main_asleep": asleep[0],
            "children_asleep": sum(asleep[1:-1]) / kids, "redis_asleep": asleep[-1],
            "busy_cpus": sum(per[:-1]) * count / wall,
            "main_switches": per[-1], "evalsha": (calls[1] - calls[0]) / count,
            "load": float(open("/proc/loadavg").read().split()[0])}


def instructions(opts: argparse.Namespace, worker: subprocess.Popen[bytes], admin: Any,
                 key: str, workdir: Path) -> dict[str, Any]:
    """The drain's instructions per task in the worker's main process, between 20% and
    80% done (``callgrind_control`` zeroes the count, then dumps it): the same figure
    run after run, whatever else the machine does, where CPU time moves by 10-30%."""
    deadline = time.monotonic() + 600  # valgrind: about 50 times slower
    start = done_at_least(admin, key, opts.n // 5, opts.n, deadline, 0.01)
    subprocess.run(["callgrind_control", "-z", str(worker.pid)], check=True,
                   capture_output=True)
    start = (start + int(admin.get(key) or 0)) / 2
    done_at_least(admin, key, opts.n * 4 // 5, opts.n, deadline, 0.01)
    end = int(admin.get(key) or 0)
    subprocess.run(["callgrind_control", "-d", str(worker.pid)], check=True,
                   capture_output=True)
    end = (end + int(admin.get(key) or 0)) / 2
    # "part 1" of the main process's profile: from the zeroing to the dump.
    with open(workdir / f"callgrind.{worker.pid}.1") as f:
        total = next(int(line.split()[1]) for line in f if line.startswith("summary:"))
    return {"tasks": end - start, "main_instructions": total / (end - start)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["rt", "paced", "drain"])
    parser.add_argument("--n", type=int, default=400,
                        help="rt: round trips (default 400); drain: tasks (use 20000)")
    parser.add_argument("--pause", type=float, default=0.002,
                        help="rt: seconds between round trips (0: back to back, as "
                             "bench/run.py's round trip)")
    parser.add_argument("--results", action="store_true",
                        help="drain: the task's result is stored (as the no-op drain's)")
    parser.add_argument("--rate", type=float, default=300.0, help="paced: tasks/s")
    parser.add_argument("--seconds", type=float, default=5.0, help="paced: seconds")
    parser.add_argument("--strace", help="write strace -c of the main process here")
    parser.add_argument("--callgrind", action="store_true",
                        help="drain: instructions per task of the worker's main process, "
                             "under valgrind (use --n 4000; about a minute)")
    parser.add_argument("--prefetch-multiplier", type=int, default=4,
                        help="the worker's worker_prefetch_multiplier (default 4, Celery's)")
    opts = parser.parse_args(argv)
    os.environ["BENCH_IDLE_PREFETCH"] = str(opts.prefetch_multiplier)
    exe = shutil.which("redis-server")
    if exe is None:
        print("redis-server is not installed", file=sys.stderr)
        return 2
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="celeriac-idle-") as tmp:
        server = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save",
                                   "", "--appendonly", "no", "--dir", tmp],
                                  stdout=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), 0.1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)
            figures = measure(opts, port, Path(tmp))
        finally:
            server.kill()
            server.wait(10)
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                      for k, v in figures.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
