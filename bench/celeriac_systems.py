"""celeriac's systems: on Redis or SQLite with a worker subprocess (``CeleriacProcess``),
and on the in-process memory broker with the worker in a thread (``CeleriacMemory``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tasks as bench_tasks
from harness import (
    CELERIAC_REDIS_DB,
    CELERIAC_REDIS_URL,
    HERE,
    STOP_TIMEOUT,
    BenchError,
    WorkerProcess,
    console,
    flush_redis_db,
    remove_doorbells,
    require_redis,
)
from systems import System, wait_io

from celeriac import Celeriac

CELERIAC_WAIT_SLICE = 2.0
"""Seconds celeriac's ``wait_for`` waits for results before the bench checks on the worker
(it rereads what is pending when restarted); a peer's driver waits ``WAIT_SLICE``."""
CHORD_BODY_GRACE = 10.0
"""Seconds the chord row waits for the body once every header task has a result: the body
is sent by the worker that stores the last of them, so it follows within milliseconds;
after this long it is not coming (the chord row fails then, not at the deadline)."""


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

    worker_env: dict[str, str] = {}
    """More environment for the worker (``sqs_system.py``: its result backend)."""

    def __init__(self, key: str, transport: str, pool: str = "solo", concurrency: int = 1,
                 events: bool = False, watched: bool = False, io: bool = False,
                 scale: int = 1, canvas: bool = False, sleep: str | None = None,
                 args: tuple[str, ...] = (), fair: bool = False) -> None:
        self.key, self.transport, self.pool, self.concurrency = key, transport, pool, concurrency
        self.events, self.watched, self.scale = events, watched, scale
        self.io = io or sleep is not None
        self.sleep = sleep
        """The sleep task (``sync`` or ``async``), counted as the I/O task is."""
        self.args = args
        """More worker options (``--child-concurrency 100``)."""
        self.fair = fair
        """The queue declared fair (``broker_fair_queues``): bench/flow.py's fair_cost."""
        self.canvas = canvas
        suffix = f"prefork x{concurrency}" if pool == "prefork" else f"{pool} x{concurrency}"
        self.name = (f"celeriac {transport} {suffix}" + (" -E" if events else "")
                     + (" watched" if watched else "") + (" I/O task" if io else "")
                     + (f" {sleep} sleep 10 ms" if sleep else "")
                     + (f" {' '.join(args)}" if args else "")
                     + (" fair queue" if fair else "")
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
        if self.fair:
            self.app.conf.update(broker_fair_queues=("celery",))
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
        if self.fair:
            env["CELERIAC_BROKER_FAIR_QUEUES"] = "celery"
        env.update(self.worker_env)
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
