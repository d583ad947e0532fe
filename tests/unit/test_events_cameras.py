"""Cameras: the shutter loop, JSONLinesCamera, loading a camera by name."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import orjson
import pytest

from celeriac.events import Camera, ClusterState, JSONLinesCamera
from celeriac.events.cameras import load_camera


class Recorder(Camera):
    def __init__(self, state: ClusterState, freq: float = 1.0) -> None:
        super().__init__(state, freq)
        self.seen: list[int] = []
        self.cleaned = False

    def on_shutter(self, state: ClusterState) -> None:
        self.seen.append(state.event_count)
        if len(self.seen) == 2:
            raise OSError("disk full, once")

    def cleanup(self) -> None:
        self.cleaned = True


def test_camera_shoots_every_freq_then_a_last_shot_and_cleanup() -> None:
    state = ClusterState()
    camera = Recorder(state, freq=0.02)

    async def main() -> None:
        stop = asyncio.Event()
        shots = asyncio.create_task(camera.arun(stop))
        for i in range(40):  # bounded: 40 x 10 ms
            state.event({"type": "worker-heartbeat", "hostname": "w", "clock": i})
            if len(camera.seen) >= 4:
                break
            await asyncio.sleep(0.01)  # sleep-ok: poll interval, bounded by the test
        stop.set()
        await asyncio.wait_for(shots, 5)

    asyncio.run(main())
    assert len(camera.seen) >= 5           # 4 or more on the timer, then the last one
    assert camera.seen == sorted(camera.seen)
    assert camera.shots == len(camera.seen) - 1   # the failing shot did not count
    assert camera.cleaned


def test_camera_refuses_a_bad_frequency() -> None:
    with pytest.raises(ValueError):
        Camera(ClusterState(), freq=0)


def test_jsonlines_camera_appends_one_snapshot_per_line(tmp_path: Path) -> None:
    state = ClusterState()
    state.event({"type": "task-received", "uuid": "u1", "name": "add", "hostname": "w",
                 "timestamp": 1.0, "clock": 1})
    path = tmp_path / "shots.jsonl"
    camera = JSONLinesCamera(state, 1.0, output=str(path))
    camera.shutter()
    state.event({"type": "task-succeeded", "uuid": "u1", "hostname": "w", "timestamp": 2.0,
                 "clock": 2, "runtime": 0.5})
    camera.shutter()
    camera.cleanup()
    assert camera.output.closed
    lines = [orjson.loads(line) for line in path.read_text().splitlines()]
    assert [snap["tasks"][0]["state"] for snap in lines] == ["RECEIVED", "SUCCESS"]
    assert lines[1]["stats"]["runtime"]["add"]["count"] == 1


def test_jsonlines_camera_to_an_open_file_and_task_limit() -> None:
    state = ClusterState()
    for i in range(5):
        state.event({"type": "task-received", "uuid": f"u{i}", "hostname": "w", "clock": i})
    out = io.StringIO()
    camera = JSONLinesCamera(state, output=out, task_limit=2)
    camera.shutter()
    camera.cleanup()
    assert not out.closed                   # not ours to close
    snap = orjson.loads(out.getvalue())
    assert [t["uuid"] for t in snap["tasks"]] == ["u4", "u3"]


def test_jsonlines_camera_defaults_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    camera = JSONLinesCamera(ClusterState(), output="-")
    camera.shutter()
    assert orjson.loads(capsys.readouterr().out)["stats"]["events"] == 0


def test_load_camera() -> None:
    assert load_camera("celeriac.events.JSONLinesCamera") is JSONLinesCamera
    assert load_camera("celeriac.events.cameras:JSONLinesCamera") is JSONLinesCamera
    for bad, match in [("nomodule_xyz.Cam", "cannot import"), ("celeriac.events.Nope", "not a"),
                       ("celeriac.events.ClusterState", "not a"), ("Cam", "expected")]:
        with pytest.raises(ValueError, match=match):
            load_camera(bad)
