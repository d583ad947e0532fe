"""Helpers for testing code that uses celeriac (and for celeriac's own tests).

- ``WorkerProcess``: a real ``celeriac worker`` in a subprocess, with its log captured,
  started and stopped with real signals.
- ``ThreadedWorker``: a worker on its own event loop in a thread of this process, for the
  memory transport (which lives in one process).
- ``wait_until``: poll a condition with a deadline instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .app import Celeriac
    from .worker import Worker

T = TypeVar("T")


def wait_until(predicate: Callable[[], T | None], timeout: float = 10.0, interval: float = 0.01,
               message: str = "condition") -> T:
    """Return the first truthy ``predicate()``; raise ``TimeoutError`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{message} not met within {timeout}s")
        time.sleep(interval)


class WorkerProcess:
    """``celeriac -A <app> worker`` as a subprocess; a context manager."""

    def __init__(self, app: str, *args: str, env: Mapping[str, str] | None = None,
                 cwd: str | None = None, loglevel: str = "info") -> None:
        self.argv = [sys.executable, "-m", "celeriac", "-A", app, "worker", "-l", loglevel,
                     *args]
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: list[str] = []
        self._lock = threading.Lock()

    def start(self, ready_timeout: float = 15.0, wait_ready: bool = True) -> WorkerProcess:
        self.proc = subprocess.Popen(
            self.argv, env=self.env, cwd=self.cwd, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
        threading.Thread(target=self._pump, daemon=True).start()
        if wait_ready:
            self.wait_for_log(r" ready: ", ready_timeout)
        return self

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with self.proc.stdout:  # closed at EOF: once the worker and its children are gone
            for raw in self.proc.stdout:
                with self._lock:
                    self._log.append(raw.decode(errors="replace"))

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def log(self) -> str:
        with self._lock:
            return "".join(self._log)

    def wait_for_log(self, pattern: str, timeout: float = 10.0) -> re.Match[str]:
        regex = re.compile(pattern)

        def found() -> re.Match[str] | None:
            if self.proc is not None and self.proc.poll() is not None:
                match = regex.search(self.log)
                if match:
                    return match
                raise RuntimeError(f"worker exited ({self.proc.returncode}) before "
                                   f"{pattern!r} appeared; log:\n{self.log}")
            return regex.search(self.log)

        try:
            return wait_until(found, timeout, message=f"log line {pattern!r}")
        except TimeoutError:
            raise TimeoutError(f"{pattern!r} not in worker log within {timeout}s:\n"
                               f"{self.log}") from None

    def signal(self, signum: int, group: bool = False) -> None:
        if group:
            os.killpg(self.pid, signum)  # as a terminal's Ctrl-C reaches the whole group
        else:
            os.kill(self.pid, signum)

    def wait(self, timeout: float = 15.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM (warm shutdown); SIGKILL if it has not exited within ``timeout``."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.wait(5)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            self.proc.wait(5)

    def __enter__(self) -> WorkerProcess:
        return self.start() if self.proc is None else self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class ThreadedWorker:
    """A ``Worker`` on its own event loop in a thread; a context manager.

    It uses the solo pool unless told otherwise: tasks then run in this process, where
    the test can see what they did (forking from a thread is not something to test with).
    """

    def __init__(self, app: Celeriac, **options: Any) -> None:
        options.setdefault("pool", "solo")
        self.worker: Worker = app.worker(install_signal_handlers=False, **options)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="celeriac-worker", daemon=True)
        self._ready = threading.Event()
        self.exit_code: int | None = None
        self.error: BaseException | None = None

    def _run(self) -> None:
        async def main() -> int:
            self._loop = asyncio.get_running_loop()
            self._loop.call_soon(self._ready.set)
            return await self.worker.run_async()

        try:
            self.exit_code = asyncio.run(main())
        except BaseException as exc:
            self.error = exc
            self._ready.set()

    def start(self) -> ThreadedWorker:
        self._thread.start()
        self._ready.wait(10)
        wait_until(lambda: self.error or getattr(self.worker, "consumer", None), 10,
                   message="worker started")
        if self.error:
            raise self.error
        return self

    def stop(self, cold: bool = False, timeout: float = 10.0) -> None:
        if self._loop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self.worker.shutdown, cold)
            self._thread.join(timeout)

    def __enter__(self) -> ThreadedWorker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def eager(app: Celeriac) -> Iterator[Celeriac]:
    """Run tasks in the calling process while the block runs (``task_always_eager``)."""
    before = app.settings
    app.settings = before.replace(task_always_eager=True)
    try:
        yield app
    finally:
        app.settings = before


__all__: Sequence[str] = ["ThreadedWorker", "WorkerProcess", "eager", "wait_until"]
