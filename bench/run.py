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

import abc
import argparse
import asyncio
import contextlib
import fcntl
import json
import logging
import os
import platform
import select
import shutil
import signal
import socket
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
from rich.markup import escape
from rich.table import Table

HERE = Path(__file__).resolve().parent
PEERS_DIR = HERE / "peers"
sys.path.insert(0, str(HERE))

import pool_overhead  # noqa: E402
import tasks as bench_tasks  # noqa: E402  (bench/tasks.py, also the worker's -A module)

from celeriac import Celeriac  # noqa: E402

REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
CELERIAC_REDIS_DB = 15
"""celeriac's Redis database; the bench empties it (FLUSHDB) before and after each run."""
CELERIAC_REDIS_URL = f"redis://{REDIS_HOST}:{REDIS_PORT}/{CELERIAC_REDIS_DB}?namespace=bench"


class BenchError(Exception):
    """A run could not be measured (worker died, results missing, deadline passed)."""


# -- systems under test ----------------------------------------------------------------------

class System(abc.ABC):
    """One broker + result store + worker, driven from this process.

    The harness calls, per run: ``setup`` (fresh, empty broker), for each of
    ``bulk_methods`` ``enqueue_bulk`` then ``purge``, ``enqueue``, ``start_worker``,
    ``wait_results``, ``latency``, and always ``stop_worker`` and ``teardown``; and
    ``close`` once after the last run. The harness reads the clocks, except
    ``start_worker`` (the worker reports when it began consuming) and ``latency`` (each
    sample is timed where the call is made).
    """

    key: str
    """The ``--systems`` name."""
    name: str
    """Row label."""
    detail: str
    """One line on how it runs (worker, pool), shown under the table."""
    bulk_methods: dict[str, str] = {}
    """Bulk enqueue methods: short label -> what exactly is called."""
    io: bool = False
    """The task does one Redis round trip (INCR on a connection of its own) and stores no
    result; the drain is timed until the counter reaches N. Such systems measure
    ``delay()`` and the drain only."""

    canvas = False
    """It measures the canvas rows (``canvas_group``, ``canvas_chord``)."""

    sent = 0
    """Tasks sent by the last ``enqueue``."""
    scale = 1
    """Workers it runs (each of 2 processes); each run sends N x this many tasks."""

    @property
    def io_key(self) -> str:
        return f"bench:io:{self.key}"

    @abc.abstractmethod
    def setup(self, workdir: Path) -> None:
        """A fresh, empty broker and result store for one run; ``workdir`` is empty."""

    @abc.abstractmethod
    def enqueue(self, n: int) -> None:
        """Publish ``n`` no-op tasks one ``delay()`` each, as a user would; keep the ids."""

    def enqueue_bulk(self, n: int, batch: int, method: str) -> None:
        """Publish ``n`` no-op tasks with bulk ``method`` (``batch`` per round trip)."""
        raise NotImplementedError

    def purge(self) -> None:
        """Delete every waiting message (after ``enqueue_bulk``)."""

    @abc.abstractmethod
    def start_worker(self, deadline: float) -> float:
        """Start one worker on the full queue; return the unix time it began consuming.

        Raise ``BenchError`` if it is not consuming by ``deadline`` (``time.monotonic``).
        """

    @abc.abstractmethod
    def wait_results(self, timeout: float) -> int:
        """Block until every task of ``enqueue`` has its result stored or ``timeout``
        passes; return how many succeeded."""

    @abc.abstractmethod
    def latency(self, count: int, warmup: int, timeout: float) -> list[float]:
        """Seconds per call of ``count`` sequential ``delay()`` + wait for the result,
        after ``warmup`` untimed ones."""

    def canvas_group(self, n: int, timeout: float) -> float:
        """Seconds to send a group of ``n`` no-ops (results stored) and have every result
        back, with the worker idle; raise if not all are back within ``timeout``."""
        raise NotImplementedError

    def canvas_chord(self, m: int, timeout: float) -> float:
        """Seconds from sending a chord of ``m`` no-ops (its body given their results'
        list, returning its length) to the body's result; raise if not back by
        ``timeout`` or if the body did not get ``m`` results."""
        raise NotImplementedError

    @abc.abstractmethod
    def stop_worker(self) -> None:
        """Stop the worker if it runs (bounded; idempotent; also after a failure)."""

    def teardown(self) -> None:
        """Release what ``setup`` made (bounded; idempotent)."""

    def close(self) -> None:
        """Release what outlives one run (a peer's driver); bounded, idempotent."""

    def diagnostics(self) -> str:
        """The end of the worker's (and driver's) log, for a failed run's report."""
        worker = getattr(self, "worker", None)
        if isinstance(worker, WorkerProcess):
            return f"worker log:\n{log_tail(worker.log_path)}"
        return ""


class CeleriacSystem(System):
    """What the celeriac systems share: the app, ``delay``, ``delay_many``, results."""

    app: Celeriac
    noop: Any
    ids: list[str]
    bulk_methods = {"delay_many": "noop.delay_many([()] * n, chunk_size={batch})"}

    def enqueue(self, n: int) -> None:
        if self.io:
            name = {"sync": bench_tasks.SLEEP, "async": bench_tasks.ASLEEP}.get(
                getattr(self, "sleep", None) or "", bench_tasks.IO)
            delay, key = self.app.tasks[name].delay, self.io_key
            self.ids = [delay(key).id for _ in range(n)]
            self.sent = n
            return
        delay = self.noop.delay
        self.ids = [delay().id for _ in range(n)]

    def enqueue_bulk(self, n: int, batch: int, method: str) -> None:
        self.noop.delay_many([()] * n, chunk_size=batch)

    def purge(self) -> None:
        self.app.transport.purge(self.app.settings.task_default_queue)

    def diagnostics(self) -> str:
        # Where the missing tasks are: still in the queue (the worker stopped taking
        # them) or held by the worker (its pool is stuck), as its own replies say.
        state: dict[str, Any] = {}
        try:
            state["ready"] = self.app.transport.queue_length(
                self.app.settings.task_default_queue)
            inspect = self.app.control.inspect(timeout=1.0)
            state["active"] = {k: len(v) for k, v in (inspect.active() or {}).items()}
            state["pool"] = {k: v.get("pool") for k, v in (inspect.stats() or {}).items()}
        except Exception as exc:
            state["error"] = repr(exc)
        return f"broker state {state}; {super().diagnostics()}"

    def wait_results(self, timeout: float) -> int:
        done = self.app.backend.wait_for(self.ids, timeout)
        return sum(1 for meta in done.values() if meta.state == "SUCCESS")

    def latency(self, count: int, warmup: int, timeout: float) -> list[float]:
        delay, clock, samples = self.noop.delay, time.perf_counter, []
        for i in range(warmup + count):
            t0 = clock()
            delay().get(timeout=timeout)
            if i >= warmup:
                samples.append(clock() - t0)
        return samples

    def teardown(self) -> None:
        app = getattr(self, "app", None)
        if app is not None:
            app.close()


class CeleriacProcess(CeleriacSystem):
    """A broker other processes reach (SQLite file, Redis), a worker subprocess."""

    def __init__(self, key: str, transport: str, pool: str = "solo", concurrency: int = 1,
                 events: bool = False, watched: bool = False, io: bool = False,
                 scale: int = 1, canvas: bool = False, sleep: str | None = None,
                 args: tuple[str, ...] = ()) -> None:
        self.key, self.transport, self.pool, self.concurrency = key, transport, pool, concurrency
        self.events, self.watched, self.scale = events, watched, scale
        self.io = io or sleep is not None
        self.sleep = sleep
        """The sleep task (``sync`` or ``async``), counted as the I/O task is."""
        self.args = args
        """More worker options (``--child-concurrency 100``)."""
        self.canvas = canvas
        suffix = f"prefork x{concurrency}" if pool == "prefork" else f"{pool} x{concurrency}"
        self.name = (f"celeriac {transport} {suffix}" + (" -E" if events else "")
                     + (" watched" if watched else "") + (" I/O task" if io else "")
                     + (f" {sleep} sleep 10 ms" if sleep else "")
                     + (f" {' '.join(args)}" if args else "")
                     + (f", {scale} workers" if scale > 1 else ""))
        where = ("broker + results in one SQLite file (WAL)" if transport == "sqlite" else
                 f"broker + results on Redis db {CELERIAC_REDIS_DB} ({CELERIAC_REDIS_URL})")
        self.detail = (f"{where}; worker: `celeriac -A tasks worker --pool {pool} "
                       f"-c {concurrency} -l warning{' -E' if events else ''}` subprocess"
                       + ("; task events on (received, started, succeeded per task), "
                          + ("a subscriber process reading them all" if watched else
                             "nobody listening") if events else ""))
        self.worker: WorkerProcess | None = None
        self.others: list[WorkerProcess] = []
        """Workers beyond the first (``scale``)."""
        self.watcher: subprocess.Popen[bytes] | None = None
        self.db_path: Path | None = None

    def url(self, workdir: Path) -> str:
        if self.transport == "redis":
            return CELERIAC_REDIS_URL
        self.db_path = workdir / "bench.db"
        return f"sqlite:///{self.db_path}"

    def setup(self, workdir: Path) -> None:
        self.workdir = workdir
        if self.transport == "redis":
            require_redis()
            flush_redis_db(CELERIAC_REDIS_DB)
        self.broker_url = self.url(workdir)
        self.app, self.noop = bench_tasks.make_app(self.broker_url)
        # Connect, and create schemas, outside the timed parts.
        self.app.transport.ping()
        self.app.backend.get("warm-up")

    def start_worker(self, deadline: float) -> float:
        exe = Path(sys.executable).with_name("celeriac")
        argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "celeriac"]
        argv += ["-A", "tasks", "worker", "--pool", self.pool, "-c", str(self.concurrency),
                 "-l", "warning", *(["-E"] if self.events else []), *self.args]
        env = {k: v for k, v in os.environ.items() if not k.startswith("CELERIAC_")}
        env.update(CELERIAC_BROKER_URL=self.broker_url,
                   PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")])))
        if self.watched:
            self.watcher = start_watcher(deadline)
        self.worker = WorkerProcess(argv, env, self.workdir, self.workdir / "worker.log")
        self.others = [WorkerProcess(argv, env, self.workdir, self.workdir / f"worker{i}.log")
                       for i in range(1, self.scale)]
        if not self.others:
            return self.worker.start(deadline)
        # All at once; the drain is timed from the first one consuming (the others
        # come up within that worker's first moments, so the figure errs low).
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(self.scale) as pool:
            ready = list(pool.map(lambda w: w.start(deadline), [self.worker, *self.others]))
        return min(ready)

    def wait_results(self, timeout: float) -> int:
        if self.io:
            return wait_io(self, timeout)
        # In slices, to notice a worker that died instead of waiting out the deadline.
        deadline = time.monotonic() + timeout
        pending, succeeded = list(self.ids), 0
        while True:
            done = self.app.backend.wait_for(
                pending, min(CELERIAC_WAIT_SLICE, max(deadline - time.monotonic(), 0)))
            succeeded += sum(1 for meta in done.values() if meta.state == "SUCCESS")
            pending = [i for i in pending if i not in done]
            if not pending or time.monotonic() >= deadline:
                return succeeded
            if self.worker is not None:
                self.worker.check_alive("mid-drain")

    def canvas_group(self, n: int, timeout: float) -> float:
        from celeriac import group

        noop, clock = self.noop, time.perf_counter
        t0 = clock()
        result = group(noop.s() for _ in range(n)).apply_async()
        values = self._canvas_wait(lambda t: result.get(timeout=t), timeout)
        elapsed = clock() - t0
        if len(values) != n:
            raise BenchError(f"group of {n}: {len(values)} results")
        return elapsed

    def canvas_chord(self, m: int, timeout: float) -> float:
        from celeriac import chord

        noop, collect = self.noop, self.app.tasks[bench_tasks.COLLECT]
        clock = time.perf_counter
        t0 = clock()
        # Celery's spelling, as the Celery side uses.
        body = chord(noop.s() for _ in range(m))(collect.s())
        header = body.parent
        header_done: list[float] = []

        def stuck() -> str | None:
            # Called between slices only (never in the first one): the header's results
            # all stored and no body CHORD_BODY_GRACE later means the body was never
            # sent; say so now rather than at the deadline, with the worker's words.
            if header is None or not header.ready():
                return None
            header_done.append(time.monotonic())
            if header_done[-1] - header_done[0] < CHORD_BODY_GRACE:
                return None
            return (f"its {m} header tasks all have results but its body was not run "
                    f"{CHORD_BODY_GRACE:g}s later; worker log: {self._log_excerpt()}")

        value = self._canvas_wait(lambda t: body.get(timeout=t), timeout, stuck)
        elapsed = clock() - t0
        if value != m:
            raise BenchError(f"chord of {m}: the body got {value} results")
        return elapsed

    def _canvas_wait(self, get: Callable[[float], Any], timeout: float,
                     stuck: Callable[[], str | None] | None = None) -> Any:
        """``get(seconds)`` in slices until it returns, checking on the worker (and with
        ``stuck``) in between; ``BenchError`` at the deadline."""
        from celeriac.errors import ResultTimeout

        deadline = time.monotonic() + timeout
        while True:
            try:
                return get(min(CELERIAC_WAIT_SLICE, max(deadline - time.monotonic(), 0)))
            except ResultTimeout:
                if time.monotonic() >= deadline:
                    raise BenchError(f"not done after {timeout:.0f}s; worker log: "
                                     f"{self._log_excerpt()}") from None
            if self.worker is not None:
                self.worker.check_alive("mid-canvas")
            why = stuck() if stuck is not None else None
            if why is not None:
                raise BenchError(why)

    def _log_excerpt(self) -> str:
        """The worker log's first error and the exception that ended its traceback (a
        chord that cannot complete logs one per header task and delivery)."""
        path = self.worker.log_path if self.worker is not None else None
        if path is None or not path.exists():
            return "(no log)"
        lines = path.read_text(errors="replace").splitlines()
        errors = [i for i, line in enumerate(lines) if "ERROR" in line]
        if not errors:
            return "\n".join(lines[-6:]) or "(empty log)"
        first = errors[0]
        raised = next((line for line in lines[first + 1:first + 40]
                       if line and not line[0].isspace() and not line.startswith("Traceback")),
                      "")
        return (f"{len(errors)} error(s), the first:\n{lines[first]}"
                + (f"\n{raised}" if raised and not raised.startswith("[") else ""))

    def stop_worker(self) -> None:
        worker, self.worker = self.worker, None
        others, self.others = self.others, []
        for w in ([worker] if worker is not None else []) + others:
            w.stop()
        watcher, self.watcher = self.watcher, None
        if watcher is not None:
            watcher.kill()
            watcher.wait(10)

    def teardown(self) -> None:
        super().teardown()
        if self.db_path is not None:
            remove_doorbells(self.db_path)
            self.db_path = None
        if self.transport == "redis":
            with contextlib.suppress(Exception):
                flush_redis_db(CELERIAC_REDIS_DB)


WATCHER = """
import sys, redis
pubsub = redis.Redis.from_url(sys.argv[1]).pubsub()
pubsub.subscribe(sys.argv[2])
for message in pubsub.listen():  # what a monitor receives, read and dropped
    pass
"""


def start_watcher(deadline: float) -> subprocess.Popen[bytes]:
    """A process subscribed to the bench worker's events channel, as a monitor would be
    (``celeriac events``, the dashboard): returns once Redis counts it."""
    import redis

    base, _, _ = CELERIAC_REDIS_URL.partition("?")
    channel = "bench:bc:celeriac.events"
    proc = subprocess.Popen([sys.executable, "-c", WATCHER, base, channel],
                            stdout=subprocess.DEVNULL, start_new_session=True)
    admin = redis.Redis.from_url(base)
    try:
        while dict(admin.pubsub_numsub(channel)).get(channel.encode(), 0) < 1:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise BenchError("the events watcher did not subscribe")
            time.sleep(0.01)  # sleep-ok: polling Redis with a deadline
    finally:
        admin.close()
    return proc


class CeleriacMemory(CeleriacSystem):
    """The in-process broker: producer and worker (its own event loop, in a thread) in
    this process, so they share one GIL."""

    def __init__(self, pool: str = "solo", concurrency: int = 1) -> None:
        self.pool, self.concurrency = pool, concurrency
        self.key = "memory" + ("" if pool == "solo" else f"-{pool}")
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


# -- peers: other task queues, each in its own virtualenv ------------------------------------

@dataclass(frozen=True)
class Peer:
    key: str
    """``--systems`` name; also the virtualenv's name, ``bench/.venv-<key>``."""
    label: str
    name: str
    """Row label."""
    requirements: tuple[str, ...]
    driver: str
    """Script in ``bench/peers`` speaking ``peerlib``'s protocol."""
    worker: tuple[str, ...]
    """The worker's command line; the first word is a script in the virtualenv's bin/."""
    redis_db: int
    bulk_methods: dict[str, str]
    detail: str
    ready_lines: int = 1
    """How many processes report ready (the drain is timed from the last)."""
    canvas: bool = False
    """Its driver answers ``group`` and ``chord`` (the canvas rows)."""


PEERS: dict[str, Peer] = {
    "celery": Peer(
        key="celery", label="Celery", name="celery redis prefork x2",
        requirements=("celery[redis]>=5.3,<6",),
        driver="celery_driver.py",
        worker=("celery", "-A", "celery_app", "worker", "--pool", "prefork", "-c", "2",
                "-l", "warning"),
        redis_db=14,
        bulk_methods={
            "group": "group(noop.s() for _ in range(n)).apply_async()",
            "producer.batch": "with producer.batch({batch}): noop.apply_async(producer=...) "
                              "x n (kombu >= 5.7 pipelines the LPUSHes)",
        },
        detail="Redis broker + Redis result backend, db 14, Celery's default settings",
        canvas=True,
    ),
    "dramatiq": Peer(
        key="dramatiq", label="Dramatiq", name="dramatiq redis 2 procs",
        requirements=("dramatiq[redis]>=1.15,<3",),
        driver="dramatiq_driver.py", worker=("dramatiq", "dramatiq_app", "-p", "2"),
        redis_db=13, ready_lines=2,
        bulk_methods={"group": "dramatiq.group(noop.message() for _ in range(n)).run()"},
        detail="Redis broker + Results middleware on Redis, db 13, Dramatiq's defaults: "
               "2 processes x 8 worker threads (with -t 1 it drains about 1/7 as fast)",
    ),
}


class PeerVenv:
    """``bench/.venv-<key>``: made with ``python3 -m venv`` and pip on first use, then
    reused while its stamp file lists the same requirements."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.path = HERE / f".venv-{peer.key}"
        self.stamp = self.path / ".bench-installed"
        self.python = self.path / "bin" / "python"
        self.log = self.path.with_name(self.path.name + ".log")

    def ready(self) -> bool:
        wanted = "\n".join(self.peer.requirements)
        return (self.python.exists() and self.stamp.exists()
                and self.stamp.read_text() == wanted)

    def ensure(self, timeout: float) -> None:
        if self.ready():
            return
        deadline = time.monotonic() + timeout
        rel = self.path.relative_to(HERE.parent)
        console.print(f"setting up {rel} (first run): pip install "
                      f"{' '.join(self.peer.requirements)} ...")
        shutil.rmtree(self.path, ignore_errors=True)
        base = shutil.which("python3") or sys.executable
        with open(self.log, "wb") as log:
            run_bounded([base, "-m", "venv", str(self.path)], deadline, log)
            run_bounded([str(self.python), "-m", "pip", "install", "-q",
                         "--disable-pip-version-check", *self.peer.requirements], deadline, log)
        self.stamp.write_text("\n".join(self.peer.requirements))
        self.log.unlink(missing_ok=True)


class PeerDriver:
    """The peer's producer: a subprocess in the peer's virtualenv, one JSON line per
    command and per answer (``peers/peerlib.py``)."""

    def __init__(self, venv: PeerVenv, env: dict[str, str], log_path: Path,
                 deadline: float) -> None:
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [str(venv.python), "-u", str(PEERS_DIR / venv.peer.driver)], cwd=PEERS_DIR,
                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                start_new_session=True)
        _LIVE.add(self.proc)
        self.buf = b""
        self._answer(deadline)

    def call(self, cmd: str, within: float, **args: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"cmd": cmd, **args}).encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise BenchError(f"driver exited; log:\n{log_tail(self.log_path)}") from None
        reply = self._answer(time.monotonic() + within, cmd)
        if not reply.get("ok"):
            raise BenchError(f"driver {cmd}: {reply.get('error')}")
        return reply

    def _answer(self, deadline: float, cmd: str = "start") -> dict[str, Any]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BenchError(f"driver {cmd}: no answer in time; log:\n"
                                 f"{log_tail(self.log_path)}")
            readable, _, _ = select.select([fd], [], [], min(remaining, 0.5))
            if readable:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise BenchError(f"driver exited during {cmd}; log:\n"
                                     f"{log_tail(self.log_path)}")
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        result: dict[str, Any] = json.loads(line)
        return result

    def close(self) -> None:
        with contextlib.suppress(Exception):
            assert self.proc.stdin is not None
            self.proc.stdin.write(b'{"cmd": "quit"}\n')
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        stop_process(self.proc, timeout=5)


class PeerSystem(System):
    """A peer on its own Redis database: its driver produces, its worker drains."""

    def __init__(self, peer: Peer, io: bool = False, sleep: bool = False,
                 worker: tuple[str, ...] | None = None, label: str | None = None,
                 key: str | None = None) -> None:
        self.peer = peer
        self.io = io or sleep
        self.sleep = sleep
        """The sleep task (10 ms of ``time.sleep``), counted as the I/O task is."""
        self.worker_argv = worker or peer.worker
        self.canvas = peer.canvas and not self.io
        self.key = key or (f"{peer.key}-sleep" if sleep else
                           f"{peer.key}-io" if io else peer.key)
        self.name = (f"{peer.label.lower()} redis {label}" if label else peer.name) + (
            " sleep 10 ms" if sleep else " I/O task" if io else "")
        self.detail = f"{peer.detail}; worker: `{' '.join(self.worker_argv)}` subprocess"
        self.bulk_methods = peer.bulk_methods
        self.venv = PeerVenv(peer)
        self.url = f"redis://{REDIS_HOST}:{REDIS_PORT}/{peer.redis_db}"
        self.driver: PeerDriver | None = None
        self.worker: WorkerProcess | None = None
        self.timeout = 60.0
        self.versions: dict[str, str] = {}

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("CELERIAC_", "VIRTUAL_ENV", "PYTHON"))}
        env.update(PYTHONPATH=str(PEERS_DIR), PYTHONUNBUFFERED="1",
                   **{f"BENCH_{self.peer.key.upper()}_URL": self.url})
        env["PATH"] = os.pathsep.join([str(self.venv.path / "bin"), env.get("PATH", "")])
        return env

    def setup(self, workdir: Path) -> None:
        self.workdir = workdir
        require_redis()
        if self.driver is None:
            self.venv.ensure(timeout=SETUP_TIMEOUT)
            self.driver = PeerDriver(self.venv, self.env(), workdir.parent /
                                     f"{self.key}-driver.log", time.monotonic() + 60)
            self.versions = self.driver.call("versions", 30)["versions"]
        self.driver.call("reset", self.timeout)

    def enqueue(self, n: int) -> None:
        assert self.driver is not None
        if self.io:
            self.driver.call("enqueue", self.timeout, n=n, key=self.io_key,
                             **({"task": bench_tasks.SLEEP} if self.sleep else {}))
            self.sent = n
        else:
            self.driver.call("enqueue", self.timeout, n=n)

    def enqueue_bulk(self, n: int, batch: int, method: str) -> None:
        assert self.driver is not None
        reply = self.driver.call("bulk", self.timeout, n=n, batch=batch, method=method)
        if "skipped" in reply:
            raise BenchError(f"bulk method {method} unavailable: {reply['skipped']}")

    def purge(self) -> None:
        assert self.driver is not None
        self.driver.call("purge", self.timeout)

    def start_worker(self, deadline: float) -> float:
        argv = [str(self.venv.path / "bin" / self.worker_argv[0]), *self.worker_argv[1:]]
        self.worker = WorkerProcess(argv, self.env(), PEERS_DIR, self.workdir / "worker.log")
        return self.worker.start(deadline, self.peer.ready_lines)

    def wait_results(self, timeout: float) -> int:
        if self.io:
            return wait_io(self, timeout)
        assert self.driver is not None
        deadline = time.monotonic() + timeout
        while True:
            reply = self.driver.call("wait", WAIT_SLICE + 30,
                                     timeout=min(WAIT_SLICE, max(deadline - time.monotonic(), 0)))
            if reply["done"] or time.monotonic() >= deadline:
                return int(reply["succeeded"])
            if self.worker is not None:
                self.worker.check_alive("mid-drain")

    def latency(self, count: int, warmup: int, timeout: float) -> list[float]:
        assert self.driver is not None
        reply = self.driver.call("latency", timeout + 5, count=count, warmup=warmup,
                                 timeout=timeout)
        return [float(s) for s in reply["samples"]]

    def canvas_group(self, n: int, timeout: float) -> float:
        # 2 x timeout: the driver's untimed warm-up round trip has the deadline too.
        assert self.driver is not None
        return float(self.driver.call("group", 2 * timeout + 30, n=n, timeout=timeout)["seconds"])

    def canvas_chord(self, m: int, timeout: float) -> float:
        assert self.driver is not None
        return float(self.driver.call("chord", 2 * timeout + 30, m=m, timeout=timeout)["seconds"])

    def stop_worker(self) -> None:
        worker, self.worker = self.worker, None
        if worker is not None:
            worker.stop()

    def teardown(self) -> None:
        with contextlib.suppress(Exception):
            flush_redis_db(self.peer.redis_db)

    def diagnostics(self) -> str:
        if self.driver is None:
            return super().diagnostics()
        try:
            state = self.driver.call("diag", 10)
            state.pop("ok", None)
        except Exception as exc:
            state = {"error": str(exc)}
        return (f"broker state {state}; {super().diagnostics()}\n"
                f"driver log:\n{log_tail(self.driver.log_path)}")

    def close(self) -> None:
        driver, self.driver = self.driver, None
        if driver is not None:
            driver.close()
            # An interrupted driver may have written after teardown's flush.
            with contextlib.suppress(Exception):
                flush_redis_db(self.peer.redis_db)


def io_counter() -> Any:
    import redis

    return redis.Redis.from_url(bench_tasks.IO_URL)


def wait_io(system: System, timeout: float) -> int:
    """Block until the I/O tasks' counter reaches N or ``timeout`` passes; returns it.
    Polled every 2 ms (one GET), checking on the worker once a second."""
    client, key, n = io_counter(), system.io_key, system.sent
    deadline = time.monotonic() + timeout
    next_check = time.monotonic() + 1.0
    seen = 0
    try:
        while True:
            done = int(client.get(key) or 0)
            if done < seen:
                # Only INCRs touch it: something else emptied the database mid-run.
                raise BenchError(f"the I/O counter went down from {seen} to {done}: "
                                 f"another program emptied {bench_tasks.IO_URL}")
            seen = done
            if done >= n or time.monotonic() >= deadline:
                return done
            if time.monotonic() >= next_check:
                next_check += 1.0
                worker = getattr(system, "worker", None)
                if worker is not None:
                    worker.check_alive("mid-drain")
            time.sleep(0.002)
    finally:
        client.close()


SYSTEMS: dict[str, Callable[[], System]] = {
    "redis": lambda: CeleriacProcess("redis", "redis", "prefork", 2, canvas=True),
    "redis-io": lambda: CeleriacProcess("redis-io", "redis", "prefork", 2, io=True),
    "redis-x4": lambda: CeleriacProcess("redis-x4", "redis", "prefork", 2, scale=4),
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
    "sqlite-prefork": lambda: CeleriacProcess("sqlite-prefork", "sqlite", "prefork", 2),
    "memory": CeleriacMemory,
    "memory-prefork": lambda: CeleriacMemory("prefork", 2),
}


# -- processes, files and databases this bench leaves nothing of -----------------------------

STOP_TIMEOUT = 15.0
INTERRUPTED_STOP_TIMEOUT = 3.0
"""After Ctrl-C, a worker gets this long to stop before it is killed (a worker in the
middle of a drain may take longer than that to stop warmly: Celery does)."""
_interrupted = False
WAIT_SLICE = 1.0
"""Seconds a peer's driver waits for results before the bench checks on the worker."""
CELERIAC_WAIT_SLICE = 2.0
"""The same for celeriac's ``wait_for`` (which rereads what is pending when restarted)."""
CHORD_BODY_GRACE = 10.0
"""Seconds the chord row waits for the body once every header task has a result: the body
is sent by the worker that stores the last of them, so it follows within milliseconds;
after this long it is not coming (the chord row fails then, not at the deadline)."""
SETUP_TIMEOUT = 600.0
_LIVE: set[subprocess.Popen[bytes]] = set()
console = Console()
if not console.is_terminal:
    console = Console(width=110)  # piped (CI logs): room for the table


def log_tail(path: Path | None, lines: int = 20) -> str:
    if path is None or not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


class WorkerProcess:
    """A worker subprocess in its own session, its output in ``log_path``; it reports
    when it is consuming on a pipe (``BENCH_READY_FD``) and stops if this process dies
    (``BENCH_PARENT``)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, log_path: Path) -> None:
        self.argv, self.env, self.cwd, self.log_path = argv, dict(env), cwd, log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, deadline: float, ready_lines: int = 1) -> float:
        """Start it; return the unix time the last of ``ready_lines`` processes (a
        worker whose processes consume on their own) reported it was consuming."""
        read_fd, write_fd = os.pipe()
        self.env.update(BENCH_READY_FD=str(write_fd), BENCH_PARENT=str(os.getpid()))
        try:
            with open(self.log_path, "ab") as log:
                # Own session: a Ctrl-C at the terminal reaches the bench only, which then
                # stops the worker itself, never leaving it behind.
                self.proc = subprocess.Popen(self.argv, cwd=self.cwd, env=self.env,
                                             stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT, pass_fds=(write_fd,),
                                             start_new_session=True)
            _LIVE.add(self.proc)
            os.close(write_fd)
            write_fd = -1
            return self._read_ready(read_fd, deadline, ready_lines)
        finally:
            os.close(read_fd)
            if write_fd >= 0:
                os.close(write_fd)

    def _read_ready(self, fd: int, deadline: float, count: int) -> float:
        assert self.proc is not None
        buf = b""
        while True:
            times = [float(line.split()[1]) for line in buf.decode(errors="replace").splitlines()
                     if line.startswith(bench_tasks.READY_LINE)]
            if len(times) >= count:
                return max(times)
            self.check_alive("before it was ready")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BenchError(f"worker not consuming in time; log:\n"
                                 f"{log_tail(self.log_path)}")
            readable, _, _ = select.select([fd], [], [], min(remaining, 0.2))
            if readable:
                chunk = os.read(fd, 4096)
                if not chunk:  # every holder closed it: wait for the exit status
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self.proc.wait(min(max(deadline - time.monotonic(), 0), 5))
                    self.check_alive("before it was ready")
                    raise BenchError("worker closed its ready pipe without a word")
                buf += chunk

    def check_alive(self, when: str) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise BenchError(f"worker exited ({self.proc.returncode}) {when}; log:\n"
                             f"{log_tail(self.log_path)}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_process(proc)
            if proc.returncode not in (0, None):
                console.print(f"[yellow]worker exited with {proc.returncode}; log:\n"
                              f"{log_tail(self.log_path)}[/]")


def stop_process(proc: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM (warm shutdown), then SIGKILL to its process group after ``timeout``
    (``INTERRUPTED_STOP_TIMEOUT`` once the bench was interrupted)."""
    if _interrupted:
        timeout = min(timeout, INTERRUPTED_STOP_TIMEOUT)
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
        with contextlib.suppress(ProcessLookupError):  # children left by a killed leader
            os.killpg(proc.pid, signal.SIGKILL)
    finally:
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        _LIVE.discard(proc)


def stop_all() -> None:
    for proc in list(_LIVE):
        with contextlib.suppress(Exception):
            stop_process(proc, timeout=5.0)


def run_bounded(argv: list[str], deadline: float, log: Any) -> None:
    """Run a setup command to completion by ``deadline``, its output to ``log``."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    _LIVE.add(proc)
    try:
        proc.wait(max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        stop_process(proc, timeout=5)
        raise BenchError(f"{' '.join(argv[:4])} ... did not finish in time") from None
    finally:
        _LIVE.discard(proc)
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(argv[:4])} ... failed ({proc.returncode}); see "
                         f"{getattr(log, 'name', 'its log')}")


def redis_reachable() -> bool:
    try:
        with socket.create_connection((REDIS_HOST, REDIS_PORT), timeout=0.5):
            return True
    except OSError:
        return False


def require_redis() -> None:
    if not redis_reachable():
        raise BenchError(f"Redis is not reachable on {REDIS_HOST}:{REDIS_PORT} (`make bench` "
                         "starts it with scripts/services.sh)")


def flush_redis_db(db: int) -> None:
    """Empty one of the bench's own Redis databases (never another, never FLUSHALL)."""
    assert db in {CELERIAC_REDIS_DB, *(p.redis_db for p in PEERS.values())}
    import redis

    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=db, socket_timeout=10,
                         socket_connect_timeout=5)
    try:
        client.flushdb()
    finally:
        client.close()


def remove_doorbells(db_path: Path) -> None:
    """celeriac's SQLite doorbell directories outlive the database file: remove them."""
    try:
        from celeriac.clients.sqlite import Doorbell
    except ImportError:
        return
    shutil.rmtree(Doorbell(str(db_path), "messages").dir.parent, ignore_errors=True)


LOCK_PATH = Path(tempfile.gettempdir()) / "celeriac-bench.lock"


@contextlib.contextmanager
def machine_lock(timeout: float) -> Iterator[None]:
    """One bench at a time on this machine: two would empty each other's Redis databases
    mid-run and share the CPUs. Waits up to ``timeout`` seconds for another to finish."""
    fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        deadline = time.monotonic() + timeout
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                    console.print(f"[yellow]another bench run (pid {holder}) is measuring on "
                                  f"this machine; waiting up to {timeout:.0f}s for it[/]")
                    told = True
                if time.monotonic() >= deadline:
                    raise BenchError(f"another bench run still holds {LOCK_PATH}") from None
                time.sleep(0.5)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Ctrl-C and SIGTERM unwind as KeyboardInterrupt, so every ``finally`` (worker
    cleanup) runs, and quickly."""
    def raise_interrupt(signum: int, frame: Any) -> None:
        global _interrupted
        if _interrupted:
            return  # a second Ctrl-C must not cut the (bounded) cleanup short
        _interrupted = True
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, raise_interrupt)
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stop_all()


# -- measuring -----------------------------------------------------------------------------

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
    if worker is None or worker.proc is None or not isinstance(worker, WorkerProcess):
        return None, None
    root, *others = process_tree(worker.proc.pid)
    children = [r for r in map(rss_mib, others) if r is not None]
    return rss_mib(root), max(children, default=None)


def percentile(samples: list[float], pct: int) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


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
                  *rss)
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
                  f"{run.startup * 1000:,.0f} ms")


# -- reporting -----------------------------------------------------------------------------

def cell(values: list[float | None], fmt: str) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    mid = format(statistics.median(got), fmt)
    if len(got) == 1:
        return mid
    return f"{mid}\n[dim]{format(min(got), fmt)}-{format(max(got), fmt)}[/]"


def ms(value: float | None) -> float | None:
    return None if value is None else value * 1000


def report(outcomes: list[Outcome], opts: argparse.Namespace) -> Table:
    table = Table(title=f"no-op tasks: N={opts.n:,} per run, median of {opts.runs} run(s) "
                        "(min-max below)")
    columns = [("system", "left"), ("enqueue\ndelay()\ntasks/s", "right")]
    if opts.batch:
        columns.append(("enqueue\nbulk (best)\ntasks/s", "right"))
    columns.append(("drain\nrun + results\ntasks/s", "right"))
    if opts.latency:
        columns += [("round trip\np50\nms", "right"), ("round trip\np99\nms", "right")]
    canvas = show_canvas(outcomes, opts)
    if canvas:
        columns += [(f"group join\n{opts.canvas_n:,} tasks\nms", "right"),
                    (f"chord\n{opts.chord_n:,} + body\nms", "right")]
    columns.append(("worker\nstartup\nms", "right"))
    columns.append(("worker RSS\nmain / child\nMiB", "right"))
    for title, justify in columns:
        table.add_column(title, justify=justify)
    for o in outcomes:
        if not o.runs:
            cols = ["[red]failed[/]"] * (len(columns) - 1)
        else:
            cols = [cell([r.enqueue for r in o.runs], ",.0f")]
            if opts.batch:
                cols.append(cell([r.best_bulk for r in o.runs], ",.0f"))
            cols.append(cell([r.drain for r in o.runs], ",.0f"))
            if opts.latency:
                cols += [cell([ms(r.p50) for r in o.runs], ".2f"),
                         cell([ms(r.p99) for r in o.runs], ".2f")]
            if canvas:
                cols += [canvas_cell(o, "group"), canvas_cell(o, "chord")]
            cols.append(cell([r.startup * 1000 for r in o.runs], ",.0f"))
            parent = o.median(lambda r: r.rss_parent)
            child = o.median(lambda r: r.rss_child)
            cols.append("-" if parent is None else
                        f"{parent:.0f} / {child:.0f}" if child is not None else f"{parent:.0f}")
        table.add_row(o.system.name + (" [red](incomplete)[/]" if o.error and o.runs else ""),
                      *cols)
    return table


def show_canvas(outcomes: list[Outcome], opts: argparse.Namespace) -> bool:
    return bool(opts.canvas and any(o.system.canvas for o in outcomes))


def canvas_cell(o: Outcome, row: str) -> str:
    """The row's median ms (min-max below), and how many runs it failed in, if any."""
    if not o.system.canvas:
        return "-"
    failed = sum(1 for r in o.runs if row in r.canvas_errors)
    shown = cell([ms(getattr(r, row)) for r in o.runs], ",.0f")
    if not failed:
        return shown
    note = f"[red]failed {failed}/{len(o.runs)}[/]"
    return note if shown == "-" else f"{shown}\n{note}"


def canvas_failures(outcomes: list[Outcome]) -> bool:
    """Print why each canvas row failed (first run's reason per row); True if any did."""
    any_failed = False
    for o in outcomes:
        for row in ("group", "chord"):
            reasons = [(i, r.canvas_errors[row]) for i, r in enumerate(o.runs, 1)
                       if row in r.canvas_errors]
            if reasons:
                any_failed = True
                i, why = reasons[0]
                console.print(f"[red]{o.system.name}: the {row} row failed in "
                              f"{len(reasons)} of {len(o.runs)} run(s); run {i}: "
                              f"{escape(why)}[/]")
    return any_failed


def details(outcomes: list[Outcome], opts: argparse.Namespace) -> None:
    for o in outcomes:
        system = o.system
        versions = getattr(system, "versions", None)
        pinned = (" (" + ", ".join(f"{k} {v}" for k, v in versions.items()) + ")"
                  if versions else "")
        console.print(f"[dim]{system.name}{pinned}: {system.detail}[/]")
        if opts.batch and o.runs:
            for method, how in system.bulk_methods.items():
                rate = o.median(lambda r, m=method: r.bulk.get(m))  # type: ignore[misc]
                shown = f"{rate:,.0f}/s" if rate else "-"
                console.print(f"[dim]    bulk {method}: {shown} = "
                              f"{how.replace('{batch}', str(opts.batch))}[/]")

TARGETS: dict[str, tuple[str, float]] = {
    # metric -> ("ratio", celeriac / Celery at least) or ("ceiling", seconds)
    "enqueue": ("ratio", 5.0),
    "bulk_vs_delay": ("ratio", 20.0),
    "bulk": ("ratio", 20.0),
    "drain": ("ratio", 10.0),
    "p50": ("ceiling", 0.001),
    "group": ("ratio", 10.0),
    "chord": ("ratio", 10.0),
}
REFERENCE = {"enqueue": 1650.0, "drain": 700.0, "p50": 0.0038}
"""Celery on the development machine when the targets were set (enqueues/s, drained/s,
p50 seconds): printed beside this run's Celery for scale."""


DRAMATIQ_DRAIN_TARGET = 2.0
"""celeriac's drain over Dramatiq's (2 processes x 8 threads), for both tasks."""


SLEEP_TARGETS = {"celery-threads-sleep": 5.0, "dramatiq-sleep": 2.0}
"""Issue 16: celeriac's async drain of 10 ms tasks over Celery's threads x16 and Dramatiq's
2 x 8, in the same run."""
SLEEP_IN_FLIGHT = 200
"""Async tasks in flight in ``redis-async-sleep`` (2 children x 100)."""


def sleep_table(outcomes: list[Outcome]) -> Table | None:
    """The 10 ms-sleep drains side by side, the targets, and the ceiling: 200 in flight
    allow 200 / 10 ms = 20,000/s, and the CPU no more than the no-op drain of this run
    (the same worker doing everything but the wait), whichever is lower."""
    by_key = {o.system.key: o for o in outcomes if o.runs}
    rows = [o for k, o in by_key.items() if k.endswith("-sleep")]
    if not rows:
        return None
    mine = by_key.get("redis-async-sleep")
    mine_drain = mine.median(lambda r: r.drain) if mine else None
    table = Table(title="10 ms-sleep tasks: drain (medians; N per run as above)")
    for title in ("system", "drain tasks/s", "async prefork / it", "target", "met?"):
        table.add_column(title, justify="left" if title == "system" else "right")
    for o in sorted(rows, key=lambda o: -(o.median(lambda r: r.drain) or 0)):
        drain = o.median(lambda r: r.drain)
        ratio = f"{mine_drain / drain:.2f}x" if mine_drain and drain else "-"
        bound = SLEEP_TARGETS.get(o.system.key)
        target = f">= {bound:g}x" if bound else ""
        met = ("" if not bound or not (mine_drain and drain) else
               "[green]yes[/]" if mine_drain / drain >= bound else "[red]no[/]")
        table.add_row(o.system.name, cell([r.drain for r in o.runs], ",.0f"), ratio, target,
                      met)
    noop = by_key.get("redis")
    noop_drain = noop.median(lambda r: r.drain) if noop else None
    if mine_drain:
        wait_bound = SLEEP_IN_FLIGHT / bench_tasks.SLEEP_SECONDS
        if noop_drain and noop is not None and mine is not None:
            ceiling = min(wait_bound, noop_drain)
            # Run by run too: runs are interleaved, so run i of each saw the same machine.
            paired = [f"{m.drain / min(wait_bound, n.drain):.0%}"
                      for m, n in zip(mine.runs, noop.runs, strict=False) if m.drain and n.drain]
            table.caption = (
                f"ceiling with {SLEEP_IN_FLIGHT} in flight: min({wait_bound:,.0f}/s the wait "
                f"allows, {noop_drain:,.0f}/s the CPU allows = this run's no-op drain) = "
                f"{ceiling:,.0f}/s; the async sleep drain is {mine_drain / ceiling:.0%} of it "
                f"(run by run against that run's no-op drain: {', '.join(paired)})")
        else:
            table.caption = (f"{SLEEP_IN_FLIGHT} in flight allow {wait_bound:,.0f}/s; add "
                             "--systems redis for the CPU-bound ceiling (the no-op drain)")
    return table


def ratio_table(outcomes: list[Outcome], opts: argparse.Namespace) -> Table | None:
    by_key = {o.system.key: o for o in outcomes if o.runs}
    ours = by_key.get("redis") or by_key.get("redis-io")
    peers = [by_key.get(k) or by_key[f"{k}-io"] for k in PEERS
             if k in by_key or f"{k}-io" in by_key]
    if ours is None or not peers:
        return None
    # (target key, label, celeriac's metric, the peer's metric, format)
    Metric = Callable[[Run], float | None]
    rows: list[tuple[str, str, Metric, Metric, str]] = [
        ("enqueue", "enqueue delay() tasks/s", lambda r: r.enqueue, lambda r: r.enqueue,
         ",.0f"),
        ("bulk_vs_delay", "enqueue: celeriac bulk vs peer delay()", lambda r: r.best_bulk,
         lambda r: r.enqueue, ",.0f"),
        ("bulk", "enqueue: bulk vs bulk (best)", lambda r: r.best_bulk,
         lambda r: r.best_bulk, ",.0f"),
        ("drain", "drain tasks/s", lambda r: r.drain, lambda r: r.drain, ",.0f"),
        ("p50", "round trip p50 ms", lambda r: ms(r.p50), lambda r: ms(r.p50), ".2f"),
        ("p99", "round trip p99 ms", lambda r: ms(r.p99), lambda r: ms(r.p99), ".2f"),
    ]
    if show_canvas(outcomes, opts):
        # As rates (tasks / seconds to the last result), so that the ratio reads as the
        # other rows' do: higher is better, the target is a multiple of Celery's.
        def group_rate(r: Run) -> float | None:
            return opts.canvas_n / r.group if r.group else None

        def chord_rate(r: Run) -> float | None:
            return opts.chord_n / r.chord if r.chord else None

        rows += [
            ("group", f"group join {opts.canvas_n:,} tasks/s", group_rate, group_rate, ",.0f"),
            ("chord", f"chord {opts.chord_n:,} tasks/s", chord_rate, chord_rate, ",.0f"),
        ]
    table = Table(title="celeriac on Redis against its peers (medians; ratio = celeriac / "
                        "peer; for round trips lower is better)")
    table.add_column("metric")
    table.add_column("celeriac\nredis", justify="right")
    for p in peers:
        label = PEERS[p.system.key.removesuffix("-io")].label
        table.add_column(label, justify="right")
        table.add_column(f"celeriac/\n{label}", justify="right")
    table.add_column("target", justify="right")
    table.add_column("met?")
    variants = [("", "")]
    if "redis-io" in by_key:
        variants.append(("-io", " (I/O task)"))
    for suffix, title in variants:
        mine_o = by_key.get("redis" + suffix)
        celery = by_key.get("celery" + suffix)
        for key, label, metric, peer_metric, fmt in rows:
            if mine_o is None or (suffix and key not in ("enqueue", "drain")):
                continue
            mine = mine_o.median(metric)
            row = [label + title, "-" if mine is None else format(mine, fmt)]
            dramatiq = None
            for p in peers:
                po = by_key.get(PEERS[p.system.key.removesuffix("-io")].key + suffix)
                theirs = po.median(peer_metric) if po else None
                if po is not None and po.system.key.startswith("dramatiq"):
                    dramatiq = theirs
                row.append("-" if theirs is None else format(theirs, fmt))
                row.append(f"{mine / theirs:.2f}x" if mine and theirs else "-")
            verdict, target = "", ""
            kind, bound = TARGETS.get(key, ("", 0.0))
            if kind == "ratio":
                target = f">= {bound:g}x Celery"
                theirs = celery.median(peer_metric) if celery else None
                ok = bool(mine and theirs and mine / theirs >= bound)
                if key == "drain":
                    target += f", {DRAMATIQ_DRAIN_TARGET:g}x Dramatiq"
                    ok = ok and bool(mine and dramatiq and
                                     mine / dramatiq >= DRAMATIQ_DRAIN_TARGET)
                if mine and theirs:
                    verdict = "[green]yes[/]" if ok else "[red]no[/]"
                elif any(key in r.canvas_errors for o in (mine_o, celery) if o
                         for r in o.runs):
                    verdict = "[red]failed[/]"  # the reason is printed under the table
            elif kind == "ceiling":
                target = f"< {bound * 1000:g} ms"
                if mine is not None:
                    verdict = "[green]yes[/]" if mine / 1000 < bound else "[red]no[/]"
            table.add_row(*row, target, verdict)
    return table


EVENTS_TARGET = 0.15
"""Task events on may slow the Redis drain by less than this share."""


def events_cost(outcomes: list[Outcome]) -> None:
    """The drain with task events on (``-E``) beside the drain without, from this run.

    The runs are interleaved, so run i with -E ran next to run i without: the share
    is the median of those pairs' shares, which drift on a shared machine moves less than
    it moves the medians of each side."""
    by_key = {o.system.key: o for o in outcomes if o.runs}
    off = by_key.get("redis")
    for key, who in (("redis-events", "nobody listening"),
                     ("redis-events-watched", "a monitor subscribed")):
        on = by_key.get(key)
        if off is None or on is None:
            continue
        shares = [1 - b.drain / a.drain for a, b in zip(off.runs, on.runs, strict=False)]
        slower = statistics.median(shares)
        verdict = "[green]yes[/]" if slower < EVENTS_TARGET else "[red]no[/]"
        console.print(f"task events, {who}: drain {on.median(lambda r: r.drain):,.0f}/s with "
                      f"-E against {off.median(lambda r: r.drain):,.0f}/s without (medians); "
                      f"run by run {', '.join(f'{x:+.1%}' for x in shares)} slower: median "
                      f"{slower:+.1%} (target < {EVENTS_TARGET:.0%}: {verdict})")


def pool_ratios(outcomes: list[Outcome]) -> None:
    """Prefork (2 children) drain over solo drain, per local transport, from this run."""
    drains = {o.system.name: o.median(lambda r: r.drain) for o in outcomes if o.runs}
    for transport in ("sqlite", "memory"):
        solo = drains.get(f"celeriac {transport} solo")
        prefork = drains.get(f"celeriac {transport} prefork x2")
        if solo and prefork:
            console.print(f"{transport}: prefork x2 drains {prefork / solo:.2f}x the solo pool")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=10_000, help="tasks per run (default 10000)")
    parser.add_argument("--runs", type=int, default=3, help="runs per system (default 3)")
    parser.add_argument("--systems", "--transports", dest="systems", default=",".join(SYSTEMS),
                        help=f"comma-separated, from: {', '.join(SYSTEMS)} (default: all)")
    parser.add_argument("--batch", type=int, default=1000,
                        help="bulk enqueue: messages per round trip; 0 skips the bulk "
                             "enqueue (default 1000)")
    parser.add_argument("--latency", type=int, default=200,
                        help="round trips timed per run; 0 skips them (default 200)")
    parser.add_argument("--warmup", type=int, default=10,
                        help="untimed round trips before those (default 10)")
    parser.add_argument("--no-pool-overhead", dest="pool_overhead", action="store_false",
                        help="skip the prefork pool overhead measurement")
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
                pings = None
                if opts.ping:
                    import control_ping
                    pings = control_ping.measure(
                        [n for n in ("celeriac", "celery") if n == "celeriac" or n in names],
                        control_ping.WORKERS, control_ping.PINGS, Path(tmp) / "ping")
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
    pool_ratios(outcomes)
    if overhead is not None:
        console.print(
            f"prefork pool overhead per task: {overhead['pool_us']:.1f} us; raw pipe round "
            f"trip between two Python processes: {overhead['raw_us']:.1f} us; ratio "
            f"{overhead['ratio']:.2f}x (target <= 3x)")
    if soak:
        console.print(soak)
    if pings is not None:
        import control_ping
        console.print(control_ping.table(pings))
    console.print(f"[dim]total {time.monotonic() - began:.0f}s[/]")
    return 1 if canvas_failed or any(o.error for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
