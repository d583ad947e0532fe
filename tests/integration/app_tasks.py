"""Tasks the integration tests run in real worker processes.

The app reads its settings from CELERIAC_* variables, so each test points the worker
subprocess and itself at the same SQLite file.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from celeriac import Celeriac, Hooks, Settings, group
from celeriac.testing import wait_until

app = Celeriac("itest", settings=Settings.from_env())


class NotAllowed(Exception):
    """A user exception type that is not on the result allow-list."""


@app.task
def add(x: int, y: int) -> int:
    return x + y


@app.task(bind=True, max_retries=3, default_retry_delay=1, acks_late=True)
def flaky(self, n):  # type: ignore[no-untyped-def]
    if self.request.retries < 2:
        raise self.retry(countdown=0.3)
    return n


@app.task(bind=True, max_retries=1)
def always_retry(self):  # type: ignore[no-untyped-def]
    raise self.retry(exc=KeyError("still broken"), countdown=0.1)


@app.task(autoretry_for=(ConnectionError,), retry_backoff=0.1, retry_jitter=False,
          max_retries=2)
def auto(marker: str) -> int:
    path = Path(marker)
    count = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(count))
    if count < 3:
        raise ConnectionError(f"attempt {count}")
    return count


@app.task
def boom(kind: str = "value") -> None:
    if kind == "value":
        raise ValueError("bad value")
    raise NotAllowed("custom failure")


@app.task
def reject_me(reason: str = "not for us") -> None:
    from celeriac.errors import Reject

    raise Reject(reason)


@app.task
def stamp() -> float:
    return time.time()


@app.task
def sleep(seconds: float, marker: str | None = None) -> float:
    if marker:
        Path(marker).write_text(str(os.getpid()))
    time.sleep(seconds)  # sleep-ok: the task's own work
    return seconds


@app.task(acks_late=False)
def at_most_once(marker: str) -> None:
    Path(marker).write_text("started")
    time.sleep(30)  # sleep-ok: the task's own work


@app.task
def die(code: int = 3) -> None:
    os._exit(code)


@app.task
def whoami() -> dict[str, object]:
    req = whoami_bound.request
    return {"called_directly": req.called_directly}


@app.task(bind=True)
def whoami_bound(self) -> dict[str, object]:  # type: ignore[no-untyped-def]
    r = self.request
    return {"id": r.id, "retries": r.retries, "hostname": r.hostname,
            "queue": r.delivery_info.get("queue"), "args": list(r.args)}


# -- for the prefork pool's fault tests --------------------------------------------------

@app.task(acks_late=True)
def kill_self(sig: int = 9, marker: str | None = None) -> str:
    """Kills its own process the first time (marker absent), succeeds after."""
    import signal as _signal

    if marker and Path(marker).exists():
        return "survived"
    if marker:
        Path(marker).write_text(str(os.getpid()))
    os.kill(os.getpid(), _signal.Signals(sig))
    time.sleep(10)  # sleep-ok: the task's own work
    return "unreachable"


@app.task
def exit_child(code: int = 3, marker: str | None = None) -> str:
    if marker and Path(marker).exists():
        return "second run"
    if marker:
        Path(marker).write_text("died once")
    os._exit(code)


@app.task(acks_late=False)
def exit_at_most_once(code: int = 3) -> None:
    os._exit(code)


@app.task(time_limit=1)
def busy_loop() -> None:
    while True:
        pass


@app.task(time_limit=1)
def blocking_sleep() -> None:
    time.sleep(1000)  # sleep-ok: the task's own work


@app.task(soft_time_limit=0.5)
def soft_limited(marker: str) -> str:
    from celeriac import SoftTimeLimitExceeded

    try:
        time.sleep(30)  # sleep-ok: the task's own work
    except SoftTimeLimitExceeded:
        Path(marker).write_text("cleaned up")
        return "cleaned up"
    return "not interrupted"


@app.task
def pid() -> int:
    return os.getpid()


_LEAK: list[bytes] = []


@app.task
def leak(mb: int = 50) -> int:
    _LEAK.append(b"x" * (mb * 1024 * 1024))
    return os.getpid()


class _ChildInit(Hooks):
    def worker_process_init(self) -> None:
        if os.environ.get("CRASH_CHILD_INIT"):
            raise RuntimeError("cannot initialise (test)")
        hang_marker = os.environ.get("HANG_FIRST_CHILD")
        if hang_marker and not Path(hang_marker).exists():
            Path(hang_marker).write_text(str(os.getpid()))
            time.sleep(1000)  # sleep-ok: the task's own work


app.add_hooks(_ChildInit())


@app.task
def segfault() -> None:
    """Crashes its child with SIGSEGV, as a broken C extension would."""
    import ctypes

    ctypes.string_at(0)


@app.task
def on_error(request, exc, traceback):  # type: ignore[no-untyped-def]
    """A new-style errback (Celery's (request, exc, traceback)): runs in the failed
    task's worker, at once."""
    Path(os.environ["ERRBACK_FILE"]).write_text(
        f"{request.id} {type(exc).__name__} {'Traceback' in traceback}")


@app.task
def failed_id(task_id: str) -> str:
    """An old-style errback: sent with the failed task's id."""
    return task_id


@app.task
def total(numbers: list[int]) -> int:
    return sum(numbers)


@app.task(bind=True)
def progress(self, gate: str) -> str:  # type: ignore[no-untyped-def]
    """Reports progress, then finishes once the test creates ``gate``."""
    self.update_state(state="PROGRESS", meta={"done": 1, "total": 2})
    wait_until(Path(gate).exists, 15, message="the test's gate")
    return "finished"


@app.task
def part(i: int) -> int:
    """A chord header task with a little work, so that kills land mid-task too."""
    time.sleep(0.002)  # sleep-ok: the task's own work
    return i


@app.task(bind=True)
def ledger(self, results: list[int], chord_no: int) -> int:  # type: ignore[no-untyped-def]
    """A chord body that counts its runs per chord in Redis (``LEDGER_KEY``), and which
    publish of the body each run was (its ``celeriac_chord_claim`` header): two claims
    for one chord would be the body fired twice."""
    import redis

    client = redis.Redis.from_url(os.environ.get("LEDGER_REDIS", "redis://127.0.0.1:6379/0"))
    claim = self.request.headers.get("celeriac_chord_claim")
    try:
        client.hincrby(os.environ["LEDGER_KEY"], str(chord_no), 1)
        client.sadd(os.environ["LEDGER_KEY"] + f":claims:{chord_no}", str(claim))
        client.hset(os.environ["LEDGER_KEY"] + ":sum", str(chord_no), sum(results))
    finally:
        client.close()
    return sum(results)


@app.task
def spawn(n: int) -> int:
    """Sends ``n`` tasks while it runs: its result's ``children``."""
    for i in range(n):
        add.delay(i, i)
    return n


@app.task(bind=True)
def replaced(self, x: int, y: int):  # type: ignore[no-untyped-def]
    """Replaces itself with ``add`` (``Task.replace``)."""
    raise self.replace(add.s(x, y))


@app.task(bind=True)
def replaced_by_group(self, x: int):  # type: ignore[no-untyped-def]
    """Replaces itself with a group: its result is the group's list."""
    raise self.replace(group(add.s(x, 1), add.s(x, 2)))


@app.task(bind=True)
def properties(self) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """The message's properties as the task sees them."""
    return {"app_id": self.request.properties.get("app_id"),
            "priority": self.request.delivery_info.get("priority")}


@app.task
def echo(value: object) -> object:
    return value
