"""Progress reports from ``update_state``: the executor's side (meta encoding, per-task
throttling, the PROGRESS frame, the hook in ``update_state``) and the solo pool turning
them into ``task-progress`` events in the worker, only with task events on."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import orjson

from celeriac import Celeriac
from celeriac.events import Event
from celeriac.runtime.progress import META_LIMIT, REPR_LIMIT, RUNNING, ProgressReporter, encode_meta
from celeriac.testing import ThreadedWorker, wait_until
from celeriac.worker.pool import pipes


class Sent:
    """A reporter's ``send``: what it was handed, decoded, from any thread."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str, Any]] = []
        self.lock = threading.Lock()

    def __call__(self, task_id: str, state: str, meta: bytes) -> None:
        with self.lock:
            self.items.append((task_id, state, orjson.loads(meta)))

    def copy(self) -> list[tuple[str, str, Any]]:
        with self.lock:
            return list(self.items)


def test_meta_travels_as_json_when_small_else_as_a_short_repr() -> None:
    assert orjson.loads(encode_meta({"done": 40, "total": 100})) == {"done": 40, "total": 100}
    assert orjson.loads(encode_meta(None)) is None
    big = orjson.loads(encode_meta({"rows": list(range(10_000))}))
    assert isinstance(big, str) and big.startswith("{'rows': [0, 1, 2")
    assert len(big) <= REPR_LIMIT
    odd = orjson.loads(encode_meta({"obj": object()}))
    assert isinstance(odd, str) and odd.startswith("{'obj': <object object")
    assert len(encode_meta({"s": "x" * (META_LIMIT - 20)})) <= META_LIMIT

    class Broken:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    assert "Broken" in orjson.loads(encode_meta(Broken()))  # reprlib names it


def test_reports_are_throttled_per_task_and_the_last_goes_before_the_end() -> None:
    sent = Sent()
    reporter = ProgressReporter(sent, interval=60.0)  # nothing waits its turn out here
    reporter.begin("a")
    reporter.begin("b")
    assert RUNNING["a"] is reporter and RUNNING["b"] is reporter
    for i in range(1, 501):  # a tight loop
        reporter.report("a", "PROGRESS", {"done": i, "total": 500})
    reporter.report("b", "OTHER", {"n": 1})  # another task has its own budget
    assert sent.copy() == [("a", "PROGRESS", {"done": 1, "total": 500}),
                           ("b", "OTHER", {"n": 1})]
    reporter.report("a", "UPLOADING", {"file": "x"})  # replaces the one that waits
    reporter.end("a")
    assert sent.copy()[-1] == ("a", "UPLOADING", {"file": "x"})
    assert len(sent.copy()) == 3
    reporter.report("a", "LATE", None)  # a thread of the ended task: dropped
    reporter.end("b")
    assert len(sent.copy()) == 3 and "a" not in RUNNING and "b" not in RUNNING


def test_a_waiting_report_is_sent_when_its_time_comes() -> None:
    """A burst followed by a quiet spell does not leave monitors on a stale state."""
    sent = Sent()
    reporter = ProgressReporter(sent, interval=0.05)
    reporter.begin("t")
    reporter.report("t", "PROGRESS", {"done": 1, "total": 2})
    reporter.report("t", "PROGRESS", {"done": 2, "total": 2})  # waits its turn
    wait_until(lambda: len(sent.copy()) == 2, 5, message="the waiting report sent")
    assert sent.copy()[-1] == ("t", "PROGRESS", {"done": 2, "total": 2})
    wait_until(lambda: reporter._flusher is None, 5, message="the flusher exited")
    reporter.end("t")
    assert len(sent.copy()) == 2  # nothing was left to send


def test_a_failing_send_never_fails_the_task() -> None:
    def send(task_id: str, state: str, meta: bytes) -> None:
        raise BrokenPipeError("the parent is gone")

    reporter = ProgressReporter(send)
    reporter.begin("t")
    reporter.report("t", "PROGRESS", 1)
    reporter.end("t")


def test_progress_frame_round_trip() -> None:
    data = pipes.encode_progress("id-1", "PROGRESS", encode_meta({"done": 1, "total": 3}))
    [(kind, payload)] = pipes.FrameReader().feed(data)
    assert kind == pipes.PROGRESS
    assert pipes.decode_progress(payload) == ("id-1", "PROGRESS", {"done": 1, "total": 3})


def test_update_state_reports_only_for_a_task_this_executor_runs(memory_app: Celeriac) -> None:
    sent = Sent()
    reporter = ProgressReporter(sent)

    @memory_app.task(name="noop")
    def noop() -> None: ...

    reporter.begin("running")
    try:
        noop.update_state(task_id="running", state="PROGRESS", meta={"done": 1, "total": 2})
        noop.update_state(task_id="elsewhere", state="PROGRESS", meta={"done": 1})
    finally:
        reporter.end("running")
    assert sent.copy() == [("running", "PROGRESS", {"done": 1, "total": 2})]
    stored = memory_app.backend.get("elsewhere")  # stored all the same
    assert stored is not None and stored.state == "PROGRESS"


def _record(worker: ThreadedWorker) -> list[Event]:
    """Every task event the worker's consumer hands to its dispatcher, in order."""
    events = worker.worker.consumer.events
    assert events is not None
    seen: list[Event] = []
    original = events.put_all

    def put_all(batch: Any) -> None:
        seen.extend(batch)
        original(batch)

    events.put_all = put_all  # type: ignore[method-assign]
    return seen


def test_solo_pool_sends_task_progress_before_the_final_event(memory_app: Celeriac,
                                                              tmp_path: Path) -> None:
    gate = tmp_path / "gate"

    @memory_app.task(name="steps", bind=True)
    def steps(self: Any, n: int) -> str:
        for i in range(1, n + 1):
            self.update_state(state="PROGRESS", meta={"done": i, "total": n})
        self.update_state(state="WAITING", meta={"gate": str(gate)})
        wait_until(gate.exists, 10, 0.005, "the test's gate")
        return "ok"

    with ThreadedWorker(memory_app, task_events=True) as w:
        seen = _record(w)
        r = steps.delay(200)

        def progress() -> list[Event]:
            return [e for e in list(seen) if e["type"] == "task-progress"]

        # The tight loop's first report goes at once; the last state (WAITING) comes
        # within the throttle's interval, while the task still runs.
        wait_until(lambda: any(e["state"] == "WAITING" for e in progress()), 5,
                   message="the last state reported while the task runs")
        gate.touch()
        assert r.get(timeout=10) == "ok"
        wait_until(lambda: any(e["type"] == "task-succeeded" for e in list(seen)), 5,
                   message="task-succeeded")
    got = progress()
    assert 2 <= len(got) <= 4, got  # 201 calls, throttled
    assert got[0]["meta"] == {"done": 1, "total": 200} and got[0]["uuid"] == r.id
    assert got[-1]["state"] == "WAITING" and got[-1]["meta"] == {"gate": str(gate)}
    types = [e["type"] for e in seen]
    assert types.index("task-succeeded") > max(i for i, t in enumerate(types)
                                               if t == "task-progress")


def test_no_progress_reporter_without_task_events(memory_app: Celeriac) -> None:
    @memory_app.task(name="one_step", bind=True)
    def one_step(self: Any) -> bool:
        self.update_state(state="PROGRESS", meta={"done": 1, "total": 1})
        return self.request.id in RUNNING

    with ThreadedWorker(memory_app) as w:
        assert w.worker.pool._reporter is None  # type: ignore[attr-defined]
        assert one_step.delay().get(timeout=10) is False
