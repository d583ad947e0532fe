"""The peers (``PEERS`` in ``harness.py``) as systems under test: each in its own
virtualenv (``PeerVenv``), produced to by a driver script there (``PeerDriver``, the
protocol of ``peers/peerlib.py``), drained by that virtualenv's worker (``PeerSystem``)."""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import tasks as bench_tasks
from harness import (
    HERE,
    LIVE,
    PEERS_DIR,
    REDIS_HOST,
    REDIS_PORT,
    BenchError,
    Peer,
    WorkerProcess,
    console,
    flush_redis_db,
    log_tail,
    require_redis,
    run_bounded,
    stop_process,
)
from systems import System, wait_io

WAIT_SLICE = 1.0
"""Seconds a peer's driver waits for results before the bench checks on the worker."""
SETUP_TIMEOUT = 600.0
"""Seconds to make a peer's virtualenv (venv + pip install) on first use."""


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
        LIVE.add(self.proc)
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
