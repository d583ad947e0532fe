"""``celeriac events``: line format and rendering (fast); dump, fallback, camera and the
live view as real subprocesses (slow)."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

import orjson
import pytest
from click.testing import CliRunner
from rich.console import Console

from celeriac import Celeriac
from celeriac.cli import main
from celeriac.cli.events import format_event, render
from celeriac.events import ClusterState, EventDispatcher
from celeriac.testing import wait_until

ROOT = Path(__file__).parent.parent.parent
APP = "tests.integration.app_tasks"


# -- fast ---------------------------------------------------------------------------------------
def test_format_event_one_line_with_task_fields() -> None:
    line = format_event({
        "type": "task-received", "hostname": "w1@h", "pid": 1, "clock": 3, "utcoffset": 0,
        "timestamp": 1_700_000_000.25, "local_received": 1.0, "uuid": "u-1", "name": "add",
        "args": "(" + "x" * 200 + ")", "kwargs": "{}", "retries": 0,
    })
    fields = line.split(" ")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", fields[0])
    assert re.fullmatch(r"\d\d:\d\d:\d\d\.250", fields[1])
    assert fields[2:6] == ["w1@h", "task-received", "u-1", "add"]
    assert fields[6].startswith("args=(xxx") and fields[6].endswith("...")
    assert len(fields[6]) == len("args=") + 60
    assert fields[7:] == ["kwargs={}", "retries=0"]
    assert "clock" not in line and "pid" not in line


def test_format_event_takes_the_name_it_is_given_and_flattens_newlines() -> None:
    line = format_event({"type": "task-failed", "hostname": "w", "timestamp": 0.0,
                         "uuid": "u", "exception": "KeyError('k')",
                         "traceback": "Traceback:\n  line\nKeyError"}, name="mul")
    assert " u mul exception=KeyError('k') traceback=Traceback:\\n  line\\nKeyError" in line
    assert "\n" not in line
    assert format_event({"type": "worker-heartbeat", "hostname": "w", "loadavg": [0.5]}
                        ).startswith("- w worker-heartbeat loadavg=[0.5]")


def test_render_draws_workers_and_tasks() -> None:
    state = ClusterState()
    state.event({"type": "worker-online", "hostname": "w1@h", "timestamp": 1.0,
                 "local_received": state.clock(), "freq": 2.0, "active": 1, "processed": 5,
                 "loadavg": [0.1, 0.2, 0.3]})
    state.event({"type": "task-succeeded", "uuid": "u1", "hostname": "w1@h", "clock": 2,
                 "timestamp": 2.0, "runtime": 0.25})
    out = io.StringIO()
    Console(file=out, width=140).print(render(state, 40))
    text = out.getvalue()
    assert "w1@h" in text and "online" in text and "0.10 0.20 0.30" in text
    assert "u1" in text and "SUCCESS" in text and "0.250s" in text


@pytest.mark.parametrize("args, message", [
    (["--dump", "--camera", "x.Y"], "do not go together"),
    (["--camera-output", "f"], "needs --camera"),
    (["--camera", "nomodule_xyz.Cam"], "cannot import"),
    (["--camera", "celeriac.events.Camera", "--camera-output", "f"], "for JSONLinesCamera"),
])
def test_usage_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["events", *args])
    assert result.exit_code == 2 and message in result.output


# -- subprocesses ---------------------------------------------------------------------------
class Proc:
    """``celeriac -A APP events ...`` with its stderr collected by a thread."""

    def __init__(self, env: dict[str, str], *args: str, stdout: Any = subprocess.PIPE,
                 stdin: Any = subprocess.DEVNULL) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celeriac", "-A", APP, "events", *args],
            env={**os.environ, **env}, stdout=stdout, stdin=stdin, stderr=subprocess.PIPE,
            text=True, cwd=ROOT)
        self.err: list[str] = []
        assert self.proc.stderr is not None
        threading.Thread(target=self._read, args=(self.proc.stderr,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.err.append(line)

    def wait_listening(self) -> None:
        wait_until(lambda: any("listening on" in line for line in self.err), 20,
                   message="celeriac events subscribed")

    def finish(self, timeout: float = 20) -> str:
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
            pytest.fail(f"celeriac events did not stop; stderr: {''.join(self.err)}")
        assert self.proc.returncode == 0, "".join(self.err)
        return out or ""


@pytest.fixture
def env(sqlite_url: str) -> dict[str, str]:
    return {"CELERIAC_BROKER_URL": sqlite_url, "PYTHONPATH": str(ROOT)}


@pytest.fixture
def dispatcher(sqlite_url: str) -> Any:
    d = EventDispatcher(Celeriac("t", broker=sqlite_url), hostname="w1@h")
    yield d
    d.close()


def _send_task_events(d: EventDispatcher, tasks: int) -> list[tuple[str, str]]:
    sent = [d.send("worker-online", freq=2.0, active=0, processed=0)]
    for i in range(tasks):
        sent.append(d.send("task-received", uuid=f"u{i}", name="tests.add", args="(1, 2)",
                           kwargs="{}"))
        sent.append(d.send("task-started", uuid=f"u{i}"))
        sent.append(d.send("task-succeeded", uuid=f"u{i}", result="3", runtime=0.001))
    assert d.flush(10)
    return [(e["type"], e.get("uuid", "")) for e in sent if e is not None]


@pytest.mark.slow
def test_dump_prints_events_in_order_and_stops_at_limit(
        env: dict[str, str], dispatcher: EventDispatcher) -> None:
    p = Proc(env, "--dump", "--limit", "31", "--timeout", "30")
    p.wait_listening()
    sent = _send_task_events(dispatcher, 10)
    lines = p.finish().splitlines()
    assert len(lines) == 31
    assert [tuple(line.split(" ")[3:5]) for line in lines[1:]] == [
        (t, u) for t, u in sent[1:]]
    assert lines[0].split(" ")[2:4] == ["w1@h", "worker-online"]
    # the task name is known from task-received and shown on later events too
    assert lines[2].split(" ")[3:6] == ["task-started", "u0", "tests.add"]
    assert "result=3 runtime=0.001" in lines[3]


@pytest.mark.slow
def test_top_without_a_terminal_falls_back_to_lines(
        env: dict[str, str], dispatcher: EventDispatcher) -> None:
    p = Proc(env, "--limit", "1", "--timeout", "30")
    p.wait_listening()
    dispatcher.send("worker-heartbeat", freq=2.0)
    lines = p.finish().splitlines()
    assert len(lines) == 1 and "worker-heartbeat" in lines[0]
    assert any("stdout is not a terminal" in line for line in p.err)


@pytest.mark.slow
def test_sigint_stops_it_cleanly(env: dict[str, str]) -> None:
    p = Proc(env, "--dump", "--timeout", "60")
    p.wait_listening()
    p.proc.send_signal(signal.SIGINT)
    assert p.finish(10) == ""
    assert not any("Traceback" in line for line in p.err)


@pytest.mark.slow
def test_camera_writes_snapshots(env: dict[str, str], dispatcher: EventDispatcher,
                                 tmp_path: Path) -> None:
    out = tmp_path / "shots.jsonl"
    p = Proc(env, "--camera", "celeriac.events.JSONLinesCamera", "--frequency", "0.1",
             "--camera-output", str(out), "--limit", "7", "--timeout", "30")
    p.wait_listening()
    _send_task_events(dispatcher, 2)
    p.finish()
    shots = [orjson.loads(line) for line in out.read_text().splitlines()]
    last = shots[-1]                          # the last shot is taken on the way out
    assert last["stats"]["events"] == 7
    assert [t["state"] for t in last["tasks"]] == ["SUCCESS", "SUCCESS"]
    assert last["workers"][0]["hostname"] == "w1@h"


@pytest.mark.slow
@pytest.mark.parametrize("quit_by", ["q", "ctrl-c"])
def test_live_view_in_a_terminal_quits_and_restores_it(
        env: dict[str, str], dispatcher: EventDispatcher, quit_by: str) -> None:
    import pty
    import termios

    master, slave = pty.openpty()
    before = termios.tcgetattr(slave)
    screen: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return
            if not chunk:
                return
            screen.append(chunk)

    p = Proc({**env, "COLUMNS": "120", "LINES": "30"}, "--timeout", "60", stdout=slave,
             stdin=slave)
    threading.Thread(target=read, daemon=True).start()
    try:
        wait_until(lambda: b"latest tasks" in b"".join(screen), 20, message="first frame")
        # The view draws before it subscribes: send until a frame shows the worker.
        def shown() -> bool:
            dispatcher.send("worker-heartbeat", freq=2.0, active=1, processed=42)
            return b"w1@h" in b"".join(screen)

        wait_until(shown, 20, interval=0.2, message="a frame with the worker")
        assert termios.tcgetattr(slave)[3] & termios.ICANON == 0   # cbreak while it runs
        if quit_by == "q":
            os.write(master, b"q")
        else:
            p.proc.send_signal(signal.SIGINT)
        p.finish(10)
        assert termios.tcgetattr(slave) == before                  # restored
    finally:
        if p.proc.poll() is None:
            p.proc.kill()
        os.close(slave)
        os.close(master)
