"""What every peer's driver and worker module share (standard library only: these files
run in the peer's own virtualenv, never in celeriac's).

The bench (``bench/run.py``) talks to a peer's driver over its stdin and stdout, one JSON
object a line. It sends ``{"cmd": NAME, ...arguments}``; the driver answers with
``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``. Commands:

- ``reset``: an empty broker and result store for one run (the peer's own Redis
  database only), and a fresh client, connected and warmed up.
- ``enqueue {"n"}``: ``n`` no-op tasks, one ``delay()`` each; the driver keeps the ids.
  With ``"key"``, the I/O task instead (``"task": "bench.sleep"``: the sleep task).
- ``bulk {"n", "batch"}``: ``n`` no-op tasks through the peer's bulk API; answers
  ``{"method": "..."}``, or ``{"skipped": "why"}`` when the peer has none.
- ``purge``: delete every waiting message (after ``bulk``).
- ``wait {"timeout"}``: block until every task of the last ``enqueue`` has a stored
  result or ``timeout`` passes; answers ``{"done": bool, "found": k, "succeeded": k}``.
  The bench calls it in slices of a second, checking on the worker in between; each call
  goes on from where the last one stopped.
- ``latency {"count", "warmup", "timeout"}``: ``count`` sequential calls, each one
  ``delay()`` and a wait for its result, with a fresh client; answers
  ``{"samples": [seconds, ...]}``.
- ``group {"n", "timeout"}`` (peers with canvas rows only): send a group of ``n`` no-ops
  with results and wait for all of them, with a fresh client (connected before the
  clock starts); answers ``{"seconds": s}``, timed in the driver.
- ``chord {"m", "timeout"}`` (same): a chord of ``m`` no-ops whose body gets the list of
  their results and returns its length; ``{"seconds": s}`` from sending to the body's
  result.
- ``ping {"n", "count", "warmup", "timeout"}`` (Celery only): ``count`` timed
  ``app.control.ping(limit=n)`` calls with ``n`` workers running; ``{"samples": [s]}``.
- ``versions``: ``{"versions": {"package": "x.y.z"}}``.
- ``quit``.

The bench reads the clocks for everything but ``latency``, ``group`` and ``chord`` (timed
where the calls are made) and the worker's ready time, which the worker module reports with
``announce_ready()`` on the pipe the bench opened for it (``BENCH_READY_FD``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from importlib import metadata
from typing import Any

READY_LINE = "bench-ready"
IO = "bench.io"
SLEEP = "bench.sleep"
"""The sleep task: ``time.sleep(SLEEP_SECONDS)`` (a network call's wait), then the I/O
task's INCR; no result."""
SLEEP_SECONDS = 0.01
IO_URL = os.environ.get("BENCH_IO_URL", "redis://127.0.0.1:6379/12")
_io: Any = None
_io_pid = 0


def io_client() -> Any:
    """This process's own Redis connection for the I/O task (one INCR per task); the
    peers' virtualenvs have redis-py, which their Redis brokers need."""
    global _io, _io_pid
    if _io is None or _io_pid != os.getpid():
        import redis

        _io, _io_pid = redis.Redis.from_url(IO_URL), os.getpid()
    return _io


def announce_ready() -> None:
    """Tell the bench this worker is consuming now (once; later calls do nothing)."""
    fd = os.environ.pop("BENCH_READY_FD", None)
    if fd is None:
        return
    try:
        os.write(int(fd), f"{READY_LINE} {time.time()!r}\n".encode())
        os.close(int(fd))
    except OSError:
        pass


def watch_parent() -> None:
    """Warm-stop this worker if the bench that started it goes away (``BENCH_PARENT``)."""
    parent = os.environ.get("BENCH_PARENT")
    if not parent:
        return

    def watch(pid: int) -> None:
        while True:
            time.sleep(0.5)
            try:
                os.kill(pid, 0)  # works from any descendant, unlike getppid()
            except ProcessLookupError:
                os.kill(os.getpid(), signal.SIGTERM)  # warm shutdown
                time.sleep(15)
                os._exit(3)
            except PermissionError:
                pass

    threading.Thread(target=watch, args=(int(parent),), daemon=True,
                     name="bench-parent-watch").start()


def versions(*packages: str) -> dict[str, str]:
    found = {}
    for name in packages:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


def serve(handlers: dict[str, Callable[..., dict[str, Any] | None]]) -> None:
    """Answer commands from stdin until ``quit`` or EOF (the bench went away)."""
    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints must not corrupt the protocol
    out.write(json.dumps({"ok": True, "hello": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        cmd = request.pop("cmd")
        if cmd == "quit":
            break
        try:
            reply = handlers[cmd](**request) or {}
            reply["ok"] = True
        except Exception as exc:
            traceback.print_exc()
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


class ResultPoller:
    """Waits, in slices, until ``fetch`` finds a result for every key in ``keys``.

    ``fetch(some_keys)`` returns one value per key, None where there is no result yet
    (one Redis round trip: an MGET, or a pipeline). Keys are checked in the order given
    (the order the tasks were sent), ``window`` at a time: a worker finishes tasks
    roughly in that order, so each poll costs about one read per new result plus one
    window of misses, and the last result is seen within ``pause`` seconds of being
    stored. ``succeeded(value)`` says whether a found result is a success.
    """

    def __init__(self, fetch: Callable[[list[Any]], list[Any]], keys: list[Any],
                 succeeded: Callable[[Any], bool], window: int = 500,
                 pause: float = 0.005) -> None:
        self.fetch, self.succeeded = fetch, succeeded
        self.pending = list(keys)
        self.found = self.ok = 0
        self.window, self.pause = window, pause

    def wait(self, timeout: float) -> dict[str, Any]:
        """Poll for up to ``timeout`` seconds; the counts so far and whether it is done."""
        deadline = time.monotonic() + timeout
        while self.pending:
            head = self.pending[:self.window]
            values = self.fetch(head)
            missing = [k for k, v in zip(head, values, strict=True) if v is None]
            self.found += len(head) - len(missing)
            self.ok += sum(1 for v in values if v is not None and self.succeeded(v))
            self.pending = missing + self.pending[self.window:]
            if missing:
                if time.monotonic() >= deadline:
                    break
                time.sleep(self.pause)
        return {"done": not self.pending, "found": self.found, "succeeded": self.ok}
