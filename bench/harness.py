"""What every part of the bench shares: where things are, the Redis databases it owns and
the peers that use them, its errors and console, its subprocesses (started, watched,
stopped, never left behind), the machine lock, and a percentile.

``run.py`` (the bench) and ``control_ping.py`` (``inspect ping``) both build on it; it
imports none of the bench's other modules but ``tasks``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tasks as bench_tasks  # bench/tasks.py, also the worker's -A module
from rich.console import Console

HERE = Path(__file__).resolve().parent
PEERS_DIR = HERE / "peers"

REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
CELERIAC_REDIS_DB = 15
"""celeriac's Redis database; the bench empties it (FLUSHDB) before and after each run."""
CELERIAC_REDIS_URL = f"redis://{REDIS_HOST}:{REDIS_PORT}/{CELERIAC_REDIS_DB}?namespace=bench"


class BenchError(Exception):
    """A run could not be measured (worker died, results missing, deadline passed)."""


# -- peers: other task queues, each in its own virtualenv (peer_systems.py) ------------------

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
    "huey": Peer(
        key="huey", label="Huey", name="huey redis 2 procs",
        requirements=("huey[redis]>=3,<4",),
        driver="huey_driver.py",
        worker=("huey_consumer", "huey_app.huey", "-k", "process", "-w", "2", "-q"),
        redis_db=10, ready_lines=2, bulk_methods={},
        detail="RedisHuey on db 10, Huey's defaults (blocking BRPOP fetch, None not "
               "stored: the I/O task's result is ignored; the no-op returns 0) but "
               "notify_result=True (a caller blocks on a notification list, no polling)",
    ),
}


# -- processes, files and databases this bench leaves nothing of -----------------------------

STOP_TIMEOUT = 15.0
INTERRUPTED_STOP_TIMEOUT = 3.0
"""After Ctrl-C, a worker gets this long to stop before it is killed (a worker in the
middle of a drain may take longer than that to stop warmly: Celery does)."""
_interrupted = False
LIVE: set[subprocess.Popen[bytes]] = set()
"""Subprocesses started and not yet stopped: ``stop_all`` stops them."""
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
            LIVE.add(self.proc)
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
        LIVE.discard(proc)


def stop_all() -> None:
    for proc in list(LIVE):
        with contextlib.suppress(Exception):
            stop_process(proc, timeout=5.0)


def run_bounded(argv: list[str], deadline: float, log: Any) -> None:
    """Run a setup command to completion by ``deadline``, its output to ``log``."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    LIVE.add(proc)
    try:
        proc.wait(max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        stop_process(proc, timeout=5)
        raise BenchError(f"{' '.join(argv[:4])} ... did not finish in time") from None
    finally:
        LIVE.discard(proc)
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


def io_counter() -> Any:
    import redis

    return redis.Redis.from_url(bench_tasks.IO_URL)


def percentile(samples: list[float], pct: int) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]
