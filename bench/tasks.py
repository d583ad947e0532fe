"""The benchmark's celeriac app and its tasks: the no-op, the I/O task, the sleep tasks
(10 ms of waiting, sync and ``async def``), and the chord body.

The bench process calls ``make_app(url)`` for a fresh app per run. A worker subprocess
loads the module-level ``app`` (``celeriac -A tasks worker``), which reads its settings
from ``CELERIAC_*`` variables (``CELERIAC_BROKER_URL``), so both sides meet on one broker.

Two switches, set only by ``bench/run.py`` for the worker it starts (the same ones the
peers' worker modules read, see ``peers/peerlib.py``):

- ``BENCH_READY_FD=<fd>``: write ``bench-ready <unix time>`` to that pipe once the worker
  is consuming, so the drain is timed from then, not from process spawn.
- ``BENCH_PARENT=<pid>``: warm-stop this worker if that process goes away (the bench
  was SIGKILLed and could not clean up).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from celeriac import Celeriac, Hooks, Settings
from celeriac.tasks import Task

NOOP = "bench.noop"
IO = "bench.io"
COLLECT = "bench.collect"
"""The chord row's body: given the list of the header's results, returns its length (the
bench checks it is the chord's size)."""
IO_URL = os.environ.get("BENCH_IO_URL", "redis://127.0.0.1:6379/12")
"""Where the I/O task counts: a Redis database of its own, so the systems' flushes of
their own databases leave it alone."""
SLEEP = "bench.sleep"
"""``time.sleep(SLEEP_SECONDS)`` then the I/O task's INCR (the peers have the same)."""
ASLEEP = "bench.asleep"
"""``await asyncio.sleep(SLEEP_SECONDS)`` then the same INCR, on the same sync client: the
count is the bench's, not the task's I/O, and it is the call every side makes. (redis-py's
asyncio client would cost twice the CPU per INCR here, 180 against 90 us, and open a
connection per command in flight: 100 per child.)"""
SLEEP_SECONDS = 0.01
READY_LINE = "bench-ready"
_io_client: Any = None
_io_pid = 0


def io_client() -> Any:
    """This process's own connection for the I/O task (made after a fork, not inherited)."""
    global _io_client, _io_pid
    if _io_client is None or _io_pid != os.getpid():
        import redis

        _io_client, _io_pid = redis.Redis.from_url(IO_URL), os.getpid()
    return _io_client


def make_app(broker_url: str | None = None) -> tuple[Celeriac, Task[[], None]]:
    """An app with the no-op task: on ``broker_url`` with results beside it (default
    settings otherwise), or, without a URL, on the ``CELERIAC_*`` environment. It also
    has the I/O task (``app.tasks[IO]``): one Redis INCR of ``key``, no result stored; and
    the chord body (``app.tasks[COLLECT]``)."""
    settings = Settings.from_env() if broker_url is None else Settings(broker_url=broker_url)
    app = Celeriac("bench", settings=settings)

    @app.task(name=NOOP)
    def noop() -> None:
        return None

    @app.task(name=IO, ignore_result=True)
    def io(key: str) -> None:
        io_client().incr(key)

    @app.task(name=SLEEP, ignore_result=True)
    def sleep(key: str) -> None:
        time.sleep(SLEEP_SECONDS)
        io_client().incr(key)

    @app.task(name=ASLEEP, ignore_result=True)
    async def asleep(key: str) -> None:
        import asyncio

        await asyncio.sleep(SLEEP_SECONDS)
        io_client().incr(key)  # one local round trip, as the other sides count

    @app.task(name=COLLECT)
    def collect(results: list[Any]) -> int:
        return len(results)

    return app, noop


class OnReady(Hooks):
    """Calls ``callback(unix_time)`` when the worker starts consuming."""

    def __init__(self, callback: Callable[[float], None]) -> None:
        self.callback = callback

    def after_worker_start(self, worker: Any) -> None:
        self.callback(time.time())


def _announcer(fd: int) -> Callable[[float], None]:
    def announce(at: float) -> None:
        try:
            os.write(fd, f"{READY_LINE} {at!r}\n".encode())
            os.close(fd)
        except OSError:
            pass

    return announce


def _watch_parent(pid: int) -> None:
    while True:
        time.sleep(0.5)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            os.kill(os.getpid(), signal.SIGTERM)  # warm shutdown
            time.sleep(15)
            os._exit(3)
        except PermissionError:
            pass


app, noop = make_app()

if ready_fd := os.environ.pop("BENCH_READY_FD", None):
    app.add_hooks(OnReady(_announcer(int(ready_fd))))
if parent := os.environ.pop("BENCH_PARENT", None):
    threading.Thread(target=_watch_parent, args=(int(parent),), daemon=True,
                     name="bench-parent-watch").start()
