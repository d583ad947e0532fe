"""Beat with a memory store and a fake clock: due times, missed-run policies, expires,
the lease and its take-over, and a stale leader's send refused by the run-key claim."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from celeriac import Celeriac
from celeriac.beat.entries import parse_entry
from celeriac.beat.service import MAX_WINDOWS, Beat, task_id_for, windows
from celeriac.canvas import Signature
from celeriac.errors import ConfigurationError
from celeriac.schedules import crontab, schedule
from celeriac.stores import store_url
from celeriac.stores.memory import MemoryStore

T0 = datetime(2024, 3, 1, 12, 0, 0, tzinfo=UTC).timestamp()


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Sent:
    """Stands in for app.send_task: records what beat sends."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, name: str, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        self.calls.append({"task": name, "args": args, "kwargs": kwargs, **options})

        class R:
            id = options.get("task_id") or "manual"
        return R()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> Iterator[Celeriac]:
    url = f"memory://{uuid.uuid4().hex}"
    a = Celeriac("t", broker=url, backend=url, beat_lease_timeout=10.0)
    a.finalize()
    sent = Sent()
    monkeypatch.setattr(a, "send_task", sent)
    yield a
    a.close()


def sent_of(app: Celeriac) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = app.send_task.calls  # type: ignore[attr-defined]
    return calls


def make_beat(app: Celeriac, clock: Clock, name: str = "b") -> Beat:
    store = MemoryStore(app.settings.backend_url, app.settings, clock=clock)
    return Beat(app, store=store, hostname=name, clock=clock, events=False)


def add(app: Celeriac, name: str, sched: Any, **options: Any) -> None:
    app._periodic[name] = parse_entry(name, {"task": "t.add", "schedule": sched,
                                             "args": (1, 2), "options": options})


# -- entries ---------------------------------------------------------------------------
def test_entry_from_celery_dict() -> None:
    e = parse_entry("every", {"task": "proj.add", "schedule": 30.0, "args": [1, 2],
                              "kwargs": {"z": 1}, "options": {"queue": "q", "priority": 5,
                                                              "expires": timedelta(seconds=9)}})
    assert (e.task, e.args, e.kwargs) == ("proj.add", (1, 2), {"z": 1})
    assert e.schedule == schedule(30.0)
    assert e.options == {"queue": "q", "priority": 5, "expires": 9.0}
    back = type(e).from_json("every", e.to_json())
    assert back == e


@pytest.mark.parametrize(("value", "match"), [
    ({"schedule": 1}, r"beat_schedule\['x'\]: task must be"),
    ({"task": "a"}, r"beat_schedule\['x'\]: schedule is missing"),
    ({"task": "a", "schedule": "soon"}, r"beat_schedule\['x'\]: schedule: cannot make"),
    ({"task": "a", "schedule": 1, "args": "ab"}, r"beat_schedule\['x'\]: args must be"),
    ({"task": "a", "schedule": 1, "kwargs": []}, r"beat_schedule\['x'\]: kwargs must be"),
    ({"task": "a", "schedule": 1, "options": {"exchange_type": "x"}},
     r"beat_schedule\['x'\]: options: exchange_type not supported"),
    ({"task": "a", "schedule": 1, "options": {"missed_runs": "twice"}},
     r"beat_schedule\['x'\]: options: missed_runs must be"),
    ({"task": "a", "schedule": 1, "options": {"priority": 11}}, r"options: priority"),
    ({"task": "a", "schedule": 1, "args": [object()]}, r"args/kwargs must be JSON"),
    ({"task": "a", "schedule": 1, "when": 3}, r"unknown field\(s\) when"),
])
def test_entry_errors_name_entry_and_field(value: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        parse_entry("x", value)


def test_settings_and_store_choice() -> None:
    with pytest.raises(ConfigurationError, match="beat_missed_runs"):
        Celeriac("t", beat_missed_runs="some")
    with pytest.raises(ConfigurationError, match="beat_lease_timeout"):
        Celeriac("t", beat_lease_timeout=0)
    assert Celeriac("t", beat_max_loop_interval=0).settings.beat_max_loop_interval == 5.0
    amqp = "amqp://guest@localhost//"
    assert store_url(Celeriac("t", broker=amqp, backend="redis://h/1").settings) == \
        "redis://h/1"
    with pytest.raises(ConfigurationError, match="set result_backend"):
        store_url(Celeriac("t", broker=amqp, backend="rpc://").settings)


def test_add_periodic_task_signature_and_task(app: Celeriac) -> None:
    @app.task
    def mul(x: int, y: int) -> int:
        return x * y

    name = app.add_periodic_task(10.0, Signature("t.add", (1,), {"k": 2}, queue="q"),
                                 name="sig", priority=3)
    assert name == "sig"
    e = app._periodic["sig"]
    assert (e.task, e.args, e.kwargs, e.options) == ("t.add", (1,), {"k": 2},
                                                     {"queue": "q", "priority": 3})
    auto = app.add_periodic_task(crontab(minute="*/5"), mul, args=(2, 3))
    assert app._periodic[auto].task == mul.name and app._periodic[auto].args == (2, 3)


# -- the scheduler ---------------------------------------------------------------------
def test_interval_runs_once_per_due_time(app: Celeriac, clock: Clock) -> None:
    add(app, "every10", 10.0)
    beat = make_beat(app, clock)
    assert beat.tick() == pytest.approx(3.33, abs=0.01)  # anchored now; renew first
    assert sent_of(app) == []
    clock.advance(10)
    beat.tick()
    beat.tick()  # again at the same instant: nothing more
    calls = sent_of(app)
    assert len(calls) == 1
    due_ms = int((T0 + 10) * 1000)
    assert calls[0]["task_id"] == task_id_for("every10", due_ms)
    assert calls[0]["expires"] == 10.0  # the interval, by default
    assert calls[0]["args"] == (1, 2)
    assert [r.key for r in beat.store.runs()] == [f"every10@{due_ms}"]


def test_crontab_expires_is_time_to_next_run(app: Celeriac, clock: Clock) -> None:
    add(app, "hourly", crontab(minute=0))
    add(app, "noexp", 5.0, expires=None)
    add(app, "own", 5.0, expires=2.5)
    beat = make_beat(app, clock)
    beat.tick()
    clock.advance(3600)
    beat.tick()
    by_task = {c["task_id"]: c for c in sent_of(app)}
    hourly = by_task[task_id_for("hourly", int((T0 + 3600) * 1000))]
    assert hourly["expires"] == 3600.0
    others = [c for c in sent_of(app) if c is not hourly]
    assert {c["expires"] for c in others} == {None, 2.5}  # once each (missed: once)


@pytest.mark.parametrize(("policy", "expected"), [("once", 1), ("all", 30), ("skip", 0)])
def test_missed_runs_policies(app: Celeriac, clock: Clock, policy: str,
                              expected: int) -> None:
    add(app, "e", 10.0, missed_runs=policy)
    beat = make_beat(app, clock)
    beat.tick()
    clock.advance(306)  # 30 windows passed while "down"; the last one 6 s ago
    beat.tick()
    assert len(sent_of(app)) == expected
    assert len({c["task_id"] for c in sent_of(app)}) == expected
    clock.advance(4)  # and on schedule afterwards
    beat.tick()
    assert len(sent_of(app)) == expected + 1


def test_global_missed_runs_setting(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"memory://{uuid.uuid4().hex}"
    app = Celeriac("t", broker=url, backend=url, beat_missed_runs="all")
    monkeypatch.setattr(app, "send_task", Sent())
    add(app, "e", 10.0)
    beat = make_beat(app, clock)
    beat.tick()
    clock.advance(50)
    beat.tick()
    assert len(sent_of(app)) == 5


def test_all_is_capped(app: Celeriac, clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    add(app, "e", 1.0, missed_runs="all")
    beat = make_beat(app, clock)
    beat.tick()
    clock.advance(MAX_WINDOWS + 500)
    beat.tick()
    assert len(sent_of(app)) == MAX_WINDOWS
    assert "500 missed runs beyond the 1000 sent were dropped" in caplog.text


def test_windows_jump_over_long_outages() -> None:
    start = datetime(2024, 1, 1, tzinfo=UTC)
    due, dropped = windows(schedule(1.0), start, start + timedelta(days=30), cap=10)
    assert len(due) == 10 and dropped > 2_000_000
    assert due[-1] <= start + timedelta(days=30)


def test_follower_takes_over_when_the_lease_lapses(app: Celeriac, clock: Clock) -> None:
    add(app, "e", 1.0)
    a, b = make_beat(app, clock, "a"), make_beat(app, clock, "b")
    a.tick()
    b.tick()
    assert (a.leading, b.leading) == (True, False)
    for _ in range(5):
        clock.advance(1)
        a.tick()
        b.tick()
    assert len(sent_of(app)) == 5
    clock.advance(10.01)  # a stops renewing (paused, killed)
    b.tick()
    assert b.leading
    assert len(sent_of(app)) == 6  # the missed windows, once
    # a wakes up believing it leads, with due times b already sent: refused
    assert a.leading
    a._entry_tick(a.load()["e"], int((T0 + 5) * 1000))
    assert a.refused == 1 and len(sent_of(app)) == 6
    a.tick()
    assert not a.leading
    keys = [r.key for r in a.store.runs()]
    assert len(keys) == len(set(keys)) == 6


def test_released_lease_is_taken_at_once(app: Celeriac, clock: Clock) -> None:
    a, b = make_beat(app, clock, "a"), make_beat(app, clock, "b")
    a.tick()
    a.close()
    b.tick()
    assert b.leading


def test_runtime_changes_through_app_beat(app: Celeriac, clock: Clock) -> None:
    add(app, "conf", 10.0)
    beat = make_beat(app, clock)
    app.beat._store = beat.store
    beat.tick()
    app.beat.add("rt", "t.mul", 5.0, args=[3])
    app.beat.disable("conf")
    for _ in range(3):  # rt is anchored at the first tick that sees it (T0 + 5)
        clock.advance(5)
        beat.tick()
    assert [c["task"] for c in sent_of(app)] == ["t.mul", "t.mul"]
    names = {r["name"]: r for r in app.beat.list()}
    assert names["conf"]["enabled"] is False and names["rt"]["source"] == "runtime"
    assert names["rt"]["next_run"] == datetime.fromtimestamp(T0 + 20, UTC).isoformat()
    assert app.beat.remove("rt")
    app.beat.enable("conf")
    clock.advance(5)
    beat.tick()
    assert [c["task"] for c in sent_of(app)][2:] == ["t.add"]
    app.beat.run("conf")
    assert len(sent_of(app)) == 4
    with pytest.raises(ConfigurationError, match="no beat entry named 'nope'"):
        app.beat.disable("nope")
