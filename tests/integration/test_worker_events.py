"""A real worker's events as an operator sees them: through ``celeriac events --dump``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from celeriac import Celeriac
from celeriac.testing import WorkerProcess, wait_until

pytestmark = pytest.mark.slow


class Dump:
    """``celeriac events --dump`` as a subprocess, its lines collected as they arrive."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celeriac", "-A", "tests.integration.app_tasks", "events",
             "--dump", "--timeout", "60"],
            env={**os.environ, **env}, cwd=cwd, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:
            for line in self.proc.stdout:
                self.lines.append(line.rstrip("\n"))

    def events(self, hostname: str) -> list[str]:
        """Event types from ``hostname``, in the order they were printed."""
        found = []
        for line in list(self.lines):
            parts = line.split()
            if len(parts) >= 4 and parts[2] == hostname:
                found.append(parts[3])
        return found

    def wait(self, condition: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
        wait_until(condition, timeout=timeout,
                   message=f"{what}; dump printed:\n" + "\n".join(self.lines[-30:]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(5)


@pytest.fixture
def events_env(env: dict[str, str]) -> dict[str, str]:
    return {**env, "CELERIAC_WORKER_HEARTBEAT_INTERVAL": "0.2"}


@pytest.fixture
def dump(events_env: dict[str, str], tmp_path: Path) -> Iterator[Dump]:
    d = Dump(events_env, tmp_path)
    try:
        # Broadcasts reach subscribers from the moment they subscribe; start only then.
        d.wait(lambda: any("listening" in line for line in d.lines), "dump never subscribed")
        yield d
    finally:
        d.stop()


def _worker(events_env: dict[str, str], tmp_path: Path, *args: str) -> WorkerProcess:
    return WorkerProcess("tests.integration.app_tasks", "-P", "solo", *args, env=events_env,
                         cwd=str(tmp_path))


@pytest.mark.parametrize("sig, shutdown", [(signal.SIGTERM, "warm"), (signal.SIGQUIT, "cold")])
def test_worker_online_heartbeats_offline_in_order(
        dump: Dump, events_env: dict[str, str], tmp_path: Path, sig: int, shutdown: str
) -> None:
    w = _worker(events_env, tmp_path, "-n", "ev1@test")
    try:
        w.start()
        dump.wait(lambda: dump.events("ev1@test").count("worker-heartbeat") >= 2,
                  "no two heartbeats from the worker")
        os.kill(w.pid, sig)
        dump.wait(lambda: "worker-offline" in dump.events("ev1@test"),
                  f"no worker-offline after a {shutdown} shutdown")
    finally:
        w.kill()
    seen = dump.events("ev1@test")
    assert seen[0] == "worker-online"
    assert seen[-1] == "worker-offline"
    assert set(seen[1:-1]) == {"worker-heartbeat"}, seen
    line = next(x for x in dump.lines if "ev1@test worker-heartbeat" in x)
    assert "freq=0.2" in line and "sw_ident=celeriac" in line and "processed=" in line


def test_without_heartbeat_sends_no_worker_events(
        dump: Dump, events_env: dict[str, str], tmp_path: Path) -> None:
    quiet = _worker(events_env, tmp_path, "-n", "quiet@test", "--without-heartbeat")
    loud = _worker(events_env, tmp_path, "-n", "loud@test")
    try:
        quiet.start()
        loud.start()
        # Both started before this wait; by three heartbeats of the loud one, the quiet
        # one would have sent its online event and a heartbeat or two.
        dump.wait(lambda: dump.events("loud@test").count("worker-heartbeat") >= 3,
                  "no heartbeats from the worker with them on")
        assert dump.events("quiet@test") == []
    finally:
        quiet.kill()
        loud.kill()


def test_dump_shows_each_tasks_lifecycle_in_order(
        dump: Dump, events_env: dict[str, str], tmp_path: Path, app: Celeriac) -> None:
    from tests.integration import app_tasks

    w = _worker(events_env, tmp_path, "-n", "life@test", "-E")
    try:
        w.start()
        ok = app_tasks.add.delay(2, 3)
        bad = app_tasks.boom.delay("value")
        retried = app_tasks.flaky.delay(7)
        assert ok.get(timeout=10) == 5 and retried.get(timeout=10) == 7

        def lifecycle(task_id: str) -> list[str]:
            return [line.split()[3] for line in list(dump.lines) if task_id in line]

        dump.wait(lambda: "task-failed" in lifecycle(bad.id) and
                  lifecycle(retried.id).count("task-succeeded") == 1,
                  "the tasks' final events never came")
    finally:
        w.kill()
    assert lifecycle(ok.id) == ["task-received", "task-started", "task-succeeded"]
    assert lifecycle(bad.id) == ["task-received", "task-started", "task-failed"]
    assert lifecycle(retried.id) == ["task-received", "task-started", "task-retried"] * 2 + [
        "task-received", "task-started", "task-succeeded"]
    failed = next(line for line in dump.lines if bad.id in line and "task-failed" in line)
    assert "ValueError" in failed
    received = next(line for line in dump.lines if ok.id in line and "task-received" in line)
    assert "(2, 3)" in received and "life@test" in received
