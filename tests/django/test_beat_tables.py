"""Beat from django-celery-beat's tables (``celeriac.beat.django``), in-process: the
tables made from its models on SQLite, rows written through its models as the admin
writes them (its signals move ``PeriodicTasks.last_update``), a memory store and a fake
clock. What is sent, when, with which options; edits, one-off clocked tasks, start and
expiry times, unreadable rows, and two beats that share the store."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from celeriac import Celeriac
from celeriac.beat.django import DjangoBeat, create_beat
from celeriac.beat.service import Beat
from celeriac.errors import ConfigurationError
from celeriac.stores.memory import MemoryStore
from tests.django import env

DJANGO = "django_celery_beat.schedulers:DatabaseScheduler"


class Clock:
    def __init__(self) -> None:
        self.now = float(int(time.time()))

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    @property
    def moment(self) -> datetime:
        return datetime.fromtimestamp(self.now, UTC)


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
def tables() -> Iterator[None]:
    env.configure()
    env.create_tables(env.SQLITE_ALIAS, ("django_celery_beat",))
    from django.db import connections

    def empty() -> None:
        with connections[env.SQLITE_ALIAS].cursor() as cur:
            for table in ("periodictask", "periodictasks", "intervalschedule",
                          "crontabschedule", "clockedschedule", "solarschedule"):
                cur.execute(f"DELETE FROM django_celery_beat_{table}")

    empty()
    yield
    empty()
    connections.close_all()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def app(tables: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Celeriac]:
    url = f"memory://{uuid.uuid4().hex}"
    a = Celeriac("t", broker=url, backend=url, beat_lease_timeout=10.0, beat_scheduler=DJANGO)
    a.finalize()
    monkeypatch.setattr(a, "send_task", Sent())
    yield a
    a.close()


def sent_of(app: Celeriac) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = app.send_task.calls  # type: ignore[attr-defined]
    return calls


def make_beat(app: Celeriac, clock: Clock, store: MemoryStore | None = None,
              name: str = "b") -> DjangoBeat:
    store = store or MemoryStore(app.settings.backend_url, app.settings, clock=clock)
    beat = create_beat(app, store=store, hostname=name, clock=clock, events=False)
    assert isinstance(beat, DjangoBeat)
    return beat


def interval_task(name: str, every: int, **fields: Any) -> Any:
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    interval, _ = IntervalSchedule.objects.get_or_create(every=every, period="seconds")
    return PeriodicTask.objects.create(name=name, task="shop.tick", interval=interval,
                                       **fields)


def row(name: str) -> Any:
    from django_celery_beat.models import PeriodicTask

    return PeriodicTask.objects.get(name=name)


def test_the_setting_selects_the_scheduler_and_refuses_others() -> None:
    with pytest.raises(ConfigurationError, match="beat_scheduler"):
        Celeriac("t", beat_scheduler="myproj.schedulers:Mine")
    url = f"memory://{uuid.uuid4().hex}"
    plain = Celeriac("t", broker=url, backend=url,
                     beat_scheduler="celery.beat:PersistentScheduler")
    beat = create_beat(plain, events=False)
    try:
        assert type(beat) is Beat
    finally:
        beat.close()


def test_an_admin_row_runs_once_per_due_time_with_its_options(app: Celeriac,
                                                              clock: Clock) -> None:
    interval_task("every-10", 10, args=json.dumps([1, 2]), kwargs=json.dumps({"k": 3}),
                  queue="reports", priority=7, headers=json.dumps({"h": "v"}),
                  expire_seconds=30)
    beat = make_beat(app, clock)
    try:
        beat.tick()
        assert sent_of(app) == []  # first seen: counts from the row's last change
        clock.advance(10)
        beat.tick()
        beat.tick()  # the same due time again: claimed already
        (call,) = sent_of(app)
        assert (call["task"], call["args"], call["kwargs"]) == ("shop.tick", (1, 2),
                                                                {"k": 3})
        assert (call["queue"], call["priority"], call["expires"]) == ("reports", 7, 30.0)
        assert call["headers"] == {"h": "v", "periodic_task_name": "every-10"}
        stored = row("every-10")
        assert stored.total_run_count == 1 and stored.last_run_at is not None
        clock.advance(25)  # two windows missed: sent once (missed_runs="once")
        beat.tick()
        assert len(sent_of(app)) == 2
    finally:
        beat.close()


def test_an_edit_in_the_admin_takes_effect_at_the_next_tick(app: Celeriac,
                                                           clock: Clock) -> None:
    interval_task("edited", 5, args=json.dumps(["old"]))
    beat = make_beat(app, clock)
    try:
        beat.tick()
        clock.advance(5)
        beat.tick()
        task = row("edited")
        task.args = json.dumps(["new"])
        task.save()  # as the admin saves: PeriodicTasks.last_update moves
        clock.advance(5)
        beat.tick()
        assert [c["args"] for c in sent_of(app)] == [("old",), ("new",)]
        task = row("edited")
        task.enabled = False
        task.save()
        clock.advance(5)
        beat.tick()
        assert len(sent_of(app)) == 2, "a disabled row is not sent"
    finally:
        beat.close()


def test_a_one_off_clocked_task_runs_once_then_is_disabled(app: Celeriac,
                                                          clock: Clock) -> None:
    from django_celery_beat.models import ClockedSchedule, PeriodicTask

    at = ClockedSchedule.objects.create(clocked_time=clock.moment + timedelta(seconds=30))
    PeriodicTask.objects.create(name="once", task="shop.tick", clocked=at, one_off=True)
    beat = make_beat(app, clock)
    try:
        beat.tick()
        clock.advance(29)
        beat.tick()
        assert sent_of(app) == []
        clock.advance(1)
        beat.tick()
        clock.advance(60)
        beat.tick()
        assert len(sent_of(app)) == 1
        assert row("once").enabled is False and row("once").total_run_count == 1
    finally:
        beat.close()


def test_start_time_holds_a_row_back_and_expires_retires_it(app: Celeriac,
                                                            clock: Clock) -> None:
    interval_task("later", 5, start_time=clock.moment + timedelta(seconds=20))
    interval_task("over", 5, expires=clock.moment + timedelta(seconds=12))
    beat = make_beat(app, clock)
    try:
        for _ in range(6):
            beat.tick()
            clock.advance(5)
        names = [c["headers"]["periodic_task_name"] for c in sent_of(app)]
        assert "over" in names and names.count("over") <= 2, names
        assert names.count("later") >= 1, names
        first_later = names.index("later")
        assert all(n == "over" for n in names[:first_later])
    finally:
        beat.close()


def test_an_unreadable_row_is_logged_and_the_others_run(app: Celeriac, clock: Clock,
                                                        caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    interval_task("broken", 5, args="not json")
    interval_task("fine", 5)
    beat = make_beat(app, clock)
    try:
        with caplog.at_level(logging.ERROR, logger="celeriac.beat.django"):
            beat.tick()
            clock.advance(5)
            beat.tick()
        assert [c["headers"]["periodic_task_name"] for c in sent_of(app)] == ["fine"]
        assert "'broken'" in caplog.text and "cannot be read" in caplog.text
    finally:
        beat.close()


def test_two_beats_on_one_store_send_each_due_time_once(app: Celeriac,
                                                        clock: Clock) -> None:
    interval_task("shared", 2)
    store = MemoryStore(app.settings.backend_url, app.settings, clock=clock)
    beats = [make_beat(app, clock, store, name) for name in ("a", "b")]
    try:
        for _ in range(5):
            for beat in beats:
                beat.tick()
            clock.advance(2)
        assert sum(b.sent for b in beats) == len(sent_of(app)) == 4
        assert [b.leading for b in beats].count(True) == 1
        ids = [c["task_id"] for c in sent_of(app)]
        assert len(set(ids)) == len(ids)
    finally:
        for beat in beats:
            beat.close()


def test_with_rabbitmq_the_django_database_is_the_shared_store(tables: None) -> None:
    from django.conf import settings

    app = Celeriac("t", broker="amqp://guest:guest@127.0.0.1:5672//",
                   backend="django-db", beat_scheduler=DJANGO)
    beat = create_beat(app, events=False)
    try:
        assert isinstance(beat, DjangoBeat)
        assert beat.store.url == f"sqlite:///{settings.DATABASES['default']['NAME']}"
    finally:
        beat.close()


def test_crontab_and_solar_rows_make_their_schedules(app: Celeriac, clock: Clock) -> None:
    from django_celery_beat.models import CrontabSchedule, PeriodicTask, SolarSchedule

    from celeriac.schedules import crontab, solar

    cron = CrontabSchedule.objects.create(minute="30", hour="9", day_of_week="1-5",
                                          timezone="Europe/Paris")
    sun = SolarSchedule.objects.create(event="sunrise", latitude="48.8566",
                                       longitude="2.3522")
    PeriodicTask.objects.create(name="weekday-mornings", task="shop.tick", crontab=cron)
    PeriodicTask.objects.create(name="dawn", task="shop.tick", solar=sun)
    beat = make_beat(app, clock)
    try:
        entries = beat.load()
        morning = entries["weekday-mornings"].schedule
        assert morning == crontab("30", "9", "1-5", tz="Europe/Paris")
        nxt = morning.next_run(clock.moment)
        assert nxt.astimezone(morning.tz).strftime("%H:%M") == "09:30"
        assert entries["dawn"].schedule == solar("sunrise", 48.8566, 2.3522)
    finally:
        beat.close()


def test_while_the_database_is_down_the_rows_read_before_still_run(
        app: Celeriac, clock: Clock, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from django.db import OperationalError

    interval_task("steady", 5)
    beat = make_beat(app, clock)
    try:
        beat.tick()

        def down(sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
            raise OperationalError("server closed the connection unexpectedly")

        monkeypatch.setattr(beat.tables, "_query", down)
        with caplog.at_level(logging.WARNING, logger="celeriac.beat.django"):
            for _ in range(3):
                clock.advance(5)
                beat.tick()
        assert len(sent_of(app)) == 3, "the rows read before kept running"
        assert caplog.text.count("cannot be read") == 1, "said once per outage"
    finally:
        monkeypatch.undo()
        beat.close()
