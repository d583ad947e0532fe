"""What monitors make of ``task-progress``: ClusterState (custom state, progress, the
final event wins, out of order), the progress text shared by ``celeriac events`` and the
dashboard, and the dashboard's API."""

from __future__ import annotations

import io
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from rich.console import Console

from celeriac import Celeriac
from celeriac.cli.events import format_event, progress_cell, render
from celeriac.dashboard import create_app
from celeriac.dashboard.monitor import Monitor, task_summary
from celeriac.events import ClusterState
from celeriac.events.state import describe_progress

with warnings.catch_warnings():  # this starlette asks for httpx2, which is not installed
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient


def ev(type_: str, clock: int, timestamp: float, hostname: str = "w1@h",
       **fields: Any) -> dict[str, Any]:
    return {"type": type_, "clock": clock, "timestamp": timestamp, "hostname": hostname,
            "pid": 100, "utcoffset": 0, "uuid": "t1", **fields}


def progress(clock: int, timestamp: float, state: str = "PROGRESS", meta: Any = None,
             hostname: str = "w1@h") -> dict[str, Any]:
    return ev("task-progress", clock, timestamp, hostname, state=state, meta=meta)


def test_progress_sets_a_running_custom_state_and_the_meta() -> None:
    s = ClusterState()
    s.event(ev("task-received", 1, 1000.0, name="proj.import"))
    s.event(ev("task-started", 2, 1000.1))
    s.event(progress(3, 1000.2, meta={"done": 40, "total": 100}))
    t = s.tasks["t1"]
    assert (t.state, t.progress, t.progressed, t.ready) == (
        "PROGRESS", {"done": 40, "total": 100}, 1000.2, False)
    assert [x.uuid for x in s.tasks_by_state("PROGRESS")] == ["t1"]
    s.event(progress(4, 1000.3, state="UPLOADING", meta={"file": "a.csv"}))
    assert (t.state, t.progress) == ("UPLOADING", {"file": "a.csv"})
    s.event(ev("task-succeeded", 5, 1000.4, result="1", runtime=0.3))
    assert (t.state, t.ready, t.progress) == ("SUCCESS", True, {"file": "a.csv"})
    assert s.state_counts() == {"SUCCESS": 1}
    totals = s.stats()["totals"]
    assert "PROGRESS" not in totals and totals["SUCCESS"] == 1  # custom states: not counted
    public = t.as_dict()
    assert public["progress"] == {"file": "a.csv"} and "progress_key" not in public


def test_a_late_progress_never_undoes_the_final_state() -> None:
    s = ClusterState()
    s.event(ev("task-started", 2, 1000.1))
    s.event(ev("task-succeeded", 9, 1000.9, result="1"))
    s.event(progress(5, 1000.5, meta={"done": 99, "total": 100}))  # sent before, came after
    t = s.tasks["t1"]
    assert t.state == "SUCCESS" and t.succeeded == 1000.9
    assert t.progress == {"done": 99, "total": 100}  # still the newest progress known
    s.event(progress(4, 1000.4, meta={"done": 50, "total": 100}))  # older still
    assert t.progress == {"done": 99, "total": 100} and t.state == "SUCCESS"


def test_progress_events_out_of_order_keep_the_newest() -> None:
    s = ClusterState()
    s.event(progress(5, 1000.5, meta={"done": 5}))   # the receiver joined mid-run
    t = s.tasks["t1"]
    assert t.state == "PROGRESS" and t.worker == "w1@h"
    s.event(progress(4, 1000.4, state="EARLIER", meta={"done": 4}))
    assert (t.state, t.progress) == ("PROGRESS", {"done": 5})
    s.event(ev("task-started", 2, 1000.1))  # late: fills in, moves nothing back
    assert (t.state, t.started) == ("PROGRESS", 1000.1)
    s.event(ev("task-failed", 7, 1000.7, exception="ValueError()"))
    assert t.state == "FAILURE"


def test_a_progress_naming_a_final_state_does_not_end_the_task() -> None:
    s = ClusterState()
    s.event(ev("task-started", 2, 1000.1))
    s.event(progress(3, 1000.2, state="SUCCESS", meta={"percent": 100}))
    t = s.tasks["t1"]
    assert (t.state, t.ready, t.progress) == ("STARTED", False, {"percent": 100})
    s.event(progress(4, 1000.3, state=123, meta=None))  # type: ignore[arg-type]
    assert t.state == "STARTED" and t.progress is None


@pytest.mark.parametrize("meta, text, ratio", [
    (None, "", None),
    ({"done": 40, "total": 100}, "40/100", 0.4),
    ({"current": 3, "total": 4}, "3/4", 0.75),            # Celery's common idiom
    ({"current": 3, "total": 0}, "3/0", None),
    ({"done": 7, "total": 5}, "7/5", 1.0),                # a bar never overflows
    ({"percent": 12.5}, "12.5%", 0.125),
    ({"progress": 0.25}, "25%", 0.25),                    # a fraction
    ({"progress": 30}, "30%", 0.3),                       # a percentage
    ({"done": True, "total": 2}, '{"done":true,"total":2}', None),
    ({"step": "upload"}, '{"step":"upload"}', None),
    ("<Thing object at 0x1>", "<Thing object at 0x1>", None),  # the worker's repr
    ({"rows": "x" * 100}, '{"rows":"' + "x" * 28 + "...", None),
])
def test_describe_progress(meta: Any, text: str, ratio: float | None) -> None:
    assert describe_progress(meta) == (text, ratio)


def test_events_view_shows_progress_and_dump_prints_the_event() -> None:
    s = ClusterState()
    s.event(ev("task-received", 1, 1000.0, name="proj.import"))
    s.event(progress(2, 1000.2, meta={"current": 40, "total": 100}))
    out = io.StringIO()
    Console(file=out, width=160).print(render(s, 40))
    screen = out.getvalue()
    assert "progress" in screen and "PROGRESS" in screen and "40/100" in screen
    assert progress_cell({"done": 5, "total": 10}, width=4).plain == "\u2588\u2588\u2591\u2591 5/10"
    assert progress_cell({"step": "x"}).plain == '{"step":"x"}'
    line = format_event(progress(2, 1000.2, meta={"done": 40, "total": 100}), "proj.import")
    assert " task-progress t1 proj.import state=PROGRESS meta={'done': 40, 'total': 100}" in line


@pytest.fixture
def web(memory_app: Celeriac) -> Iterator[TestClient]:
    with TestClient(create_app(memory_app, receive_events=False)) as client:
        yield client


def test_dashboard_lists_and_details_progress(web: TestClient) -> None:
    m: Monitor = web.app.state.monitor  # type: ignore[attr-defined]
    m.handle(ev("task-received", 1, 1000.0, name="proj.import", args="()", kwargs="{}"))
    m.handle(ev("task-started", 2, 1000.1))
    m.handle(progress(3, 1000.2, meta={"done": 40, "total": 100}))

    [row] = web.get("/api/tasks").json()["tasks"]
    assert (row["state"], row["progress"], row["progress_text"], row["progress_ratio"]) == (
        "PROGRESS", {"done": 40, "total": 100}, "40/100", 0.4)
    assert row["updated"] == 1000.2  # a progress is an update: the page's merge keeps it
    assert [t["uuid"] for t in web.get("/api/tasks?state=progress").json()["tasks"]] == ["t1"]
    detail = web.get("/api/tasks/t1").json()
    assert detail["progress"] == {"done": 40, "total": 100} and detail["progressed"] == 1000.2

    # the live path: the changed task goes to SSE clients as a summary
    assert "t1" in m._dirty
    summary = task_summary(m.state.tasks["t1"])
    assert summary["progress_text"] == "40/100"

    page = web.get("/static/dashboard.js").text
    assert "progressCell" in page and "progress_ratio" in page
    assert "<th>Progress</th>" in web.get("/").text
