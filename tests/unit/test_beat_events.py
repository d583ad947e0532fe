"""Beat's events (``beat-sent``, ``beat-leader``) as monitors see them: a real
dispatcher on the memory broker, ``ClusterState``, ``celeriac events`` lines, the
dashboard's ``/api/beat``, and the CLI's ``beat`` commands on a SQLite store."""

from __future__ import annotations

import asyncio
import json
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from celeriac import Celeriac
from celeriac.beat.entries import parse_entry
from celeriac.beat.service import Beat
from celeriac.cli import main
from celeriac.cli.events import format_event, render
from celeriac.dashboard import create_app
from celeriac.events import ClusterState, EventReceiver
from celeriac.schedules import crontab
from tests.unit.test_beat import Clock

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient


def test_beat_events_reach_a_receiver_and_the_state() -> None:
    url = f"memory://{uuid.uuid4().hex}"
    app = Celeriac("t", broker=url, backend=url)
    app._periodic["e"] = parse_entry("e", {"task": "t.x", "schedule": 1.0})
    clock = Clock()
    seen: list[dict[str, Any]] = []
    receiver = EventReceiver(app, {"*": seen.append})
    async def run() -> None:
        async with receiver:
            beat = Beat(app, hostname="beat@h", clock=clock)
            beat.tick()
            clock.advance(1)
            await asyncio.to_thread(beat.tick)
            await asyncio.to_thread(beat.close)
            await receiver.acapture(limit=3, timeout=5)

    asyncio.run(run())
    app.close()
    types = [e["type"] for e in seen]
    assert types == ["beat-leader", "beat-sent", "beat-leader"]
    sent = seen[1]
    assert sent["entry"] == "e" and sent["task"] == "t.x" and sent["run_key"].startswith("e@")
    state = ClusterState()
    for e in seen[:2]:
        state.event(e)
    assert state.beat_leader == seen[0]["beat"] and state.beat_sent["e"] is sent
    line = format_event(sent)
    assert "beat@h beat-sent entry=e task=t.x" in line
    assert render(state, 40) is not None
    state.event(seen[2])
    assert state.beat_leader is None


def test_api_beat(memory_app: Celeriac) -> None:
    memory_app.add_periodic_task(crontab(minute="*/5"), "t.x", name="five")
    client = TestClient(create_app(memory_app, receive_events=False))
    body = client.get("/api/beat").json()
    assert [e["name"] for e in body["entries"]] == ["five"]
    assert body["entries"][0]["schedule_data"]["type"] == "crontab"
    assert body["entries"][0]["next_run"] and body["leader"] is None


def test_api_beat_without_a_store() -> None:
    app = Celeriac("t", broker="amqp://guest@127.0.0.1//", backend="rpc://")
    client = TestClient(create_app(app, receive_events=False))
    body = client.get("/api/beat").json()
    assert "set result_backend" in body["error"]


def test_cli_beat_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cliapp.py").write_text(
        "from celeriac import Celeriac\n"
        f"app = Celeriac('cliapp', broker='sqlite:///{tmp_path}/c.db', beat_schedule="
        "{'conf': {'task': 'cliapp.x', 'schedule': 30.0}})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()

    def beat(*args: str) -> Any:
        return runner.invoke(main, ["-A", "cliapp", "beat", *args], catch_exceptions=False)

    assert beat("add", "five", "cliapp.y", "*/5 * * * *", "--args", "[1]").exit_code == 0
    assert beat("add", "bad", "cliapp.y", "* *").exit_code == 2
    assert beat("add", "bad", "cliapp.y", "5m", "--args", "{}").exit_code == 2
    assert beat("disable", "conf").exit_code == 0
    rows = {e["name"]: e for e in json.loads(beat("list", "--json").output)["entries"]}
    assert rows["five"]["args"] == [1] and rows["five"]["schedule_data"]["minute"]
    assert rows["conf"]["enabled"] is False
    assert beat("enable", "conf").exit_code == 0
    assert beat("run", "five").exit_code == 0
    assert beat("remove", "five").exit_code == 0
    gone = beat("remove", "five")
    assert gone.exit_code == 1 and "no beat entry named 'five'" in gone.output
    assert "conf" in beat("list").output
