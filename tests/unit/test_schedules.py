"""celeriac.schedules: Celery's schedule, crontab and solar, with exact DST rules."""

from __future__ import annotations

import importlib.util
import json
import sys
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from types import SimpleNamespace
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter

from celeriac.schedules import (
    BaseSchedule,
    app_timezone,
    crontab,
    from_dict,
    maybe_schedule,
    schedstate,
    schedule,
    solar,
)
from celeriac.settings import Settings

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
needs_ephem = pytest.mark.skipif(importlib.util.find_spec("ephem") is None, reason="no ephem")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def runs(s: BaseSchedule, after: datetime, n: int) -> list[datetime]:
    out = []
    for _ in range(n):
        after = s.next_run(after)
        out.append(after)
    return out


# -- crontab against croniter ----------------------------------------------------------------

# Cron ORs day-of-month with day-of-week when both are restricted, Celery ANDs them; so every
# expression here leaves at least one of the two as "*", where both agree.
CRON_TABLE = [
    "* * * * *", "*/5 * * * *", "*/15 * * * *", "*/7 * * * *", "0 * * * *", "30 * * * *",
    "5,10,45 * * * *", "1-30/5 * * * *", "5/15 * * * *", "0,30 * * 12 *", "0 0 * * *",
    "30 2 * * *", "59 23 * * *", "15 */3 * * *", "0 */5 * * *", "0 1-23/2 * * *",
    "0 0,12 * * *", "0 9-17 * * *", "0 9-17 * * mon-fri", "*/10 9-17 * * 1-5", "0 0 * * 0",
    "0 0 * * sun", "0 12 * * sat,sun", "0 0 * * 1,3,5", "0 8 * * tue", "45 17 * * 5",
    "0 3 * * mon", "* 0 * * 6", "20 4 * 11 thu", "0 0 1 * *", "0 0 15 * *", "0 0 31 * *",
    "0 0 30 * *", "0 0 29 2 *", "0 0 28-31 * *", "0 0 */2 * *", "0 0 2-30/7 * *",
    "30 4 1,15 * *", "0 0 10-20 * *", "0 0 1 1 *", "0 0 1 */3 *", "0 0 1 jan-jun *",
    "0 6 * 6-8 *", "0 0 * 2 *", "10 10 * jul *", "59 23 31 12 *",
]
STARTS = [
    utc(2026, 1, 1),
    utc(2026, 2, 28, 23, 59, 30),
    utc(2026, 3, 31, 23, 30),
    utc(2026, 6, 15, 13, 7, 45, 500000),
    utc(2026, 12, 31, 23, 59),
    utc(2028, 2, 28, 12, 0),  # a leap year
]


@pytest.mark.parametrize("expression", CRON_TABLE)
def test_crontab_agrees_with_croniter(expression: str) -> None:
    assert len(CRON_TABLE) >= 40
    s = crontab.from_string(expression)
    for start in STARTS:
        cron = croniter(expression, start)
        expected = [cron.get_next(datetime) for _ in range(4)]
        assert runs(s, start, 4) == expected, (expression, start)


def test_day_of_month_and_day_of_week_both_must_match() -> None:
    # Celery ANDs them: Friday the 13th. Cron would also run on every Friday and every 13th.
    friday_13th = crontab(0, 0, day_of_week="fri", day_of_month=13)
    assert runs(friday_13th, utc(2026, 1, 1), 3) == [
        utc(2026, 2, 13), utc(2026, 3, 13), utc(2026, 11, 13)]
    first_monday = crontab(0, 9, day_of_week="mon", day_of_month="1-7")
    assert runs(first_monday, utc(2026, 1, 1), 3) == [
        utc(2026, 1, 5, 9), utc(2026, 2, 2, 9), utc(2026, 3, 2, 9)]
    # February 29th on a Monday: the search walks by month and still finds it, 18 years on.
    leap_monday = crontab.from_string("0 0 29 2 mon")
    assert leap_monday.next_run(utc(2026, 1, 1)) == utc(2044, 2, 29)


def test_celery_syntax_beyond_cron() -> None:
    # Ranges wrap past the top, as in Celery: fri-mon is fri, sat, sun, mon.
    assert crontab(day_of_week="fri-mon").day_of_week == (0, 1, 5, 6)
    assert crontab(minute="50-10/5").minute == (0, 5, 10, 50, 55)
    assert crontab(day_of_week="Monday,WED").day_of_week == (1, 3)
    assert crontab(month_of_year="Jan-Mar").month_of_year == (1, 2, 3)
    assert crontab(minute={0, 15}, hour=[9, 17]).hour == (9, 17)
    assert crontab(minute=" 0, 30 ").minute == (0, 30)
    weekend = crontab(0, 0, day_of_week="sat-sun")
    assert runs(weekend, utc(2026, 1, 1), 3) == [utc(2026, 1, 3), utc(2026, 1, 4), utc(2026, 1, 10)]


def test_next_run_is_strictly_after() -> None:
    s = crontab("*/15")
    assert s.next_run(utc(2026, 1, 1, 12, 0)) == utc(2026, 1, 1, 12, 15)
    assert s.next_run(utc(2026, 1, 1, 11, 59, 59, 999999)) == utc(2026, 1, 1, 12, 0)
    assert schedule(30).next_run(utc(2026, 1, 1)) == utc(2026, 1, 1, 0, 0, 30)


def test_from_string() -> None:
    s = crontab.from_string("*/5 1 2 3 4")
    assert s == crontab(minute="*/5", hour=1, day_of_week=4, day_of_month=2, month_of_year=3)
    assert repr(crontab.from_string("*/5 * * * *")) == "<crontab: */5 * * * * (m/h/dM/MY/d)>"
    assert crontab.from_string("0 9 * * *", tz="Europe/Berlin").tz == BERLIN
    with pytest.raises(ValueError, match="5 fields"):
        crontab.from_string("* * * *")


# -- daylight saving time --------------------------------------------------------------------


def test_fall_back_hour_fires_once_at_first_occurrence() -> None:
    # 2026-11-01: New York's clocks go 01:59 EDT -> 01:00 EST; 01:30 happens twice.
    s = crontab(minute=30, hour=1, tz=NEW_YORK)
    assert runs(s, utc(2026, 10, 31, 12), 3) == [
        utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30), utc(2026, 11, 3, 6, 30)]
    # Berlin 2026-10-25: 02:30 CEST (00:30 UTC) runs, 02:30 CET (01:30 UTC) does not.
    assert runs(crontab(30, 2, tz=BERLIN), utc(2026, 10, 24, 12), 2) == [
        utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]


def test_after_in_the_second_occurrence_skips_the_repeated_hour() -> None:
    second_0130 = datetime(2026, 11, 1, 1, 30, fold=1, tzinfo=NEW_YORK)  # 06:30 UTC
    assert crontab("*/15", tz=NEW_YORK).next_run(second_0130) == utc(2026, 11, 1, 7, 0)


def test_spring_forward_gap_fires_at_first_instant_after() -> None:
    # Berlin 2026-03-29: 02:00 CET jumps to 03:00 CEST, so 02:30 never happens.
    s = crontab(minute=30, hour=2, tz=BERLIN)
    assert runs(s, utc(2026, 3, 28, 12), 2) == [utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)]
    assert s.next_run(utc(2026, 3, 28, 12)).astimezone(BERLIN).hour == 3
    # New York 2026-03-08: 02:00 EST jumps to 03:00 EDT (07:00 UTC).
    ny = crontab(minute=30, hour=2, tz=NEW_YORK)
    assert runs(ny, utc(2026, 3, 7, 12), 2) == [utc(2026, 3, 8, 7, 0), utc(2026, 3, 9, 6, 30)]


@pytest.mark.parametrize(
    ("zone", "spring", "fall"),
    [(BERLIN, utc(2026, 3, 29, 1), utc(2026, 10, 25, 1)),
     (NEW_YORK, utc(2026, 3, 8, 7), utc(2026, 11, 1, 6))],
)
def test_quarter_hours_across_both_transitions(
    zone: ZoneInfo, spring: datetime, fall: datetime
) -> None:
    s = crontab("*/15", tz=zone)
    for change in (spring, fall):
        start, end = change - timedelta(hours=3), change + timedelta(hours=3)
        got = []
        at = s.next_run(start)
        while at <= end:
            got.append(at)
            at = s.next_run(at)
        # Every real quarter hour whose local time is a first occurrence (fold=0): the
        # skipped hour needs no entries of its own, the repeated hour runs once.
        quarters = [start + timedelta(minutes=15 * i) for i in range(1, 25)]
        assert got == [q for q in quarters if q.astimezone(zone).fold == 0]
        assert len(got) == 24 - (4 if change == fall else 0)
        assert len(set(got)) == len(got)
    spring_runs = runs(s, spring - timedelta(minutes=15), 2)
    assert spring_runs == [spring, spring + timedelta(minutes=15)]
    fall_runs = runs(s, fall - timedelta(minutes=15), 2)
    assert fall_runs == [fall + timedelta(hours=1), fall + timedelta(hours=1, minutes=15)]


def test_intervals_are_real_elapsed_time_across_dst() -> None:
    hourly = schedule(timedelta(hours=1), tz=NEW_YORK)
    before_gap = datetime(2026, 3, 8, 1, 30, tzinfo=NEW_YORK)  # 06:30 UTC
    assert hourly.next_run(before_gap) == utc(2026, 3, 8, 7, 30)  # 03:30 EDT, not 02:30
    first_0130 = datetime(2026, 11, 1, 1, 30, tzinfo=NEW_YORK)  # EDT
    assert hourly.next_run(first_0130) == utc(2026, 11, 1, 6, 30)  # 01:30 EST
    daily = schedule(timedelta(days=1), tz=NEW_YORK)
    noon = datetime(2026, 10, 31, 12, tzinfo=NEW_YORK)
    assert daily.next_run(noon).astimezone(NEW_YORK).hour == 11  # 24 real hours
    for after in runs(hourly, utc(2026, 3, 7), 60):
        assert hourly.next_run(after) - after == timedelta(hours=1)


def test_relative_interval_rounds_to_its_resolution() -> None:
    hourly = schedule(timedelta(hours=1), relative=True)
    assert hourly.next_run(utc(2026, 1, 1, 10, 20, 5)) == utc(2026, 1, 1, 11)
    assert schedule(90, relative=True).next_run(utc(2026, 1, 1, 10, 20, 45)) == utc(
        2026, 1, 1, 10, 22)
    assert schedule(timedelta(days=1), relative=True, tz=BERLIN).next_run(
        utc(2026, 1, 1, 10)) == utc(2026, 1, 1, 23)  # Berlin midnight
    # In New York's repeated hour the rounding keeps the occurrence: 01:00 EST, not EDT.
    nyc = schedule(timedelta(hours=1), relative=True, tz=NEW_YORK)
    assert nyc.next_run(utc(2026, 11, 1, 5, 40)) == utc(2026, 11, 1, 6)
    # Rounding a day back over a fall-back lands before `after`: the unrounded time wins.
    daily = schedule(timedelta(days=1), relative=True, tz=NEW_YORK)
    after = utc(2026, 11, 1, 4, 30)  # 00:30 EDT, so +24h is 23:30 EST
    assert daily.next_run(after) == after + timedelta(days=1)


# -- is_due and remaining_estimate ------------------------------------------------------------

NOW = utc(2026, 1, 1, 12, 7)


def test_interval_is_due() -> None:
    s = schedule(30, nowfun=lambda: NOW)
    state = s.is_due(NOW - timedelta(seconds=10))
    assert isinstance(state, schedstate) and type(state).__name__ == "schedstate"
    assert state == (False, 20.0) and state.is_due is False and state.next == 20.0
    assert s.is_due(NOW - timedelta(seconds=30)) == (True, 30.0)
    assert s.is_due(NOW - timedelta(hours=1)) == (True, 30.0)
    assert s.remaining_estimate(NOW - timedelta(seconds=10)) == timedelta(seconds=20)
    assert s.remaining_estimate(NOW - timedelta(seconds=90)) == timedelta(seconds=-60)


def test_crontab_is_due() -> None:
    s = crontab("*/15", nowfun=lambda: NOW)
    assert s.is_due(utc(2026, 1, 1, 12, 0)) == (False, 480.0)
    assert s.remaining_estimate(utc(2026, 1, 1, 12, 0)) == timedelta(minutes=8)
    assert s.is_due(utc(2026, 1, 1, 11, 50)) == (True, 480.0)  # next check: 12:15
    late = crontab("*/15", nowfun=lambda: utc(2026, 1, 1, 12, 16))
    assert late.is_due(utc(2026, 1, 1, 12, 0)) == (True, 840.0)


def test_is_due_compares_real_time_in_local_zones() -> None:
    # now is the second 01:10 (EST), last run the first 01:00 (EDT): 70 real minutes ago.
    now = datetime(2026, 11, 1, 1, 10, fold=1, tzinfo=NEW_YORK)
    s = schedule(timedelta(hours=1), tz=NEW_YORK, nowfun=lambda: now)
    last = datetime(2026, 11, 1, 1, 0, tzinfo=NEW_YORK)
    assert s.remaining_estimate(last) == timedelta(minutes=-10)
    assert s.is_due(last) == (True, 3600.0)


def test_naive_datetimes_are_refused() -> None:
    naive = datetime(2026, 1, 1)
    with pytest.raises(ValueError, match="after"):
        crontab().next_run(naive)
    with pytest.raises(ValueError, match="after"):
        schedule(5).next_run(naive)
    with pytest.raises(ValueError, match="last_run_at"):
        schedule(5, nowfun=lambda: NOW).is_due(naive)
    with pytest.raises(ValueError, match="nowfun"):
        schedule(5, nowfun=lambda: naive).is_due(NOW)


# -- construction, coercion, storage ---------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("minute", "61"), ("minute", 60), ("minute", "*/0"), ("minute", ""), ("minute", "-5"),
        ("minute", "1-60"), ("minute", [0, 61]), ("minute", "5-"), ("minute", "*/x"),
        ("minute", "1,,2"), ("minute", "mon"), ("minute", []),
        ("hour", "24"), ("hour", 24), ("hour", "*/0"), ("hour", " "),
        ("day_of_week", "funday"), ("day_of_week", 7), ("day_of_week", "mon-funday"),
        ("day_of_week", ""), ("day_of_week", "jan"),
        ("day_of_month", "0"), ("day_of_month", 32), ("day_of_month", "1-32"),
        ("day_of_month", ""), ("day_of_month", "30,31"),  # in February only: below
        ("month_of_year", "13"), ("month_of_year", 0), ("month_of_year", "foo"),
        ("month_of_year", ""),
    ],
)
def test_invalid_crontab_names_the_field(field: str, value: object) -> None:
    kwargs = {field: value}
    if value == "30,31":
        kwargs["month_of_year"] = 2
    with pytest.raises(ValueError, match=f"crontab {field}"):
        crontab(**kwargs)  # type: ignore[arg-type]


def test_out_of_range_message() -> None:
    with pytest.raises(ValueError, match="crontab minute: 61 is out of range 0-59"):
        crontab(minute="61")
    with pytest.raises(TypeError, match="crontab hour"):
        crontab(hour=1.5)  # type: ignore[arg-type]


def test_invalid_intervals() -> None:
    for bad in (0, -1, timedelta(0), float("nan"), float("inf")):
        with pytest.raises(ValueError, match="run_every"):
            schedule(bad)
    with pytest.raises(TypeError, match="run_every"):
        schedule("30")  # type: ignore[arg-type]


def test_search_is_bounded() -> None:
    # February 29th after 9996 would be in 10000: the search ends instead of looping.
    with pytest.raises(ValueError, match="no run"):
        crontab(0, 0, day_of_month=29, month_of_year=2).next_run(utc(9997, 1, 1))


def test_maybe_schedule() -> None:
    assert maybe_schedule(30) == schedule(30)
    assert maybe_schedule(1.5).run_every == timedelta(seconds=1.5)  # type: ignore[attr-defined]
    assert maybe_schedule(timedelta(minutes=1)) == schedule(60)
    c = crontab()
    assert maybe_schedule(c) is c
    for bad in ("30", None, True):
        with pytest.raises(TypeError, match=repr(bad)):
            maybe_schedule(bad)  # type: ignore[arg-type]


ALL_KINDS = [
    schedule(30),
    schedule(timedelta(hours=1), relative=True, tz=BERLIN),
    crontab("*/5"),
    crontab(minute=[0, 30], hour="9-17", day_of_week="mon-fri", tz="America/New_York"),
    crontab(0, 0, day_of_month=13, day_of_week="fri", month_of_year="jan-jun"),
    solar("sunrise", 52.52, 13.405, tz=BERLIN),
]


@pytest.mark.parametrize("s", ALL_KINDS, ids=repr)
def test_to_dict_from_dict_round_trip(s: BaseSchedule) -> None:
    stored = json.loads(json.dumps(s.to_dict()))
    back = from_dict(stored)
    assert back == s and type(back) is type(s) and hash(back) == hash(s)
    assert back.tz == s.tz and back.to_dict() == s.to_dict() and repr(back) == repr(s)


def test_dict_forms() -> None:
    assert crontab("*/5").to_dict() == {
        "type": "crontab", "minute": "*/5", "hour": "*", "day_of_week": "*",
        "day_of_month": "*", "month_of_year": "*", "tz": "UTC"}
    assert crontab(minute={30, 0}, hour=9).to_dict()["minute"] == "0,30"
    assert from_dict({"type": "interval", "seconds": 30.0}) == schedule(30)
    assert from_dict({"type": "crontab", "minute": "*/5"}) == crontab("*/5")
    assert schedule(30).to_dict() == {
        "type": "interval", "seconds": 30.0, "relative": False, "tz": "UTC"}
    with pytest.raises(ValueError, match="type"):
        from_dict({"type": "lunar"})
    with pytest.raises(ValueError, match="seconds"):
        from_dict({"type": "interval"})


def test_equality_and_repr() -> None:
    assert crontab("*/30") == crontab("0,30") == crontab([0, 30])  # expanded, as in Celery
    assert crontab("*/30") != crontab("*/30", tz=BERLIN)
    assert crontab() != schedule(60) and schedule(60) != schedule(61)
    assert len({schedule(60), schedule(timedelta(minutes=1))}) == 1
    assert repr(schedule(30)) == "<freq: 30.00 seconds>"
    assert repr(schedule(3600)) == "<freq: 1.00 hour>"
    assert repr(crontab(30, 1, "mon")) == "<crontab: 30 1 * * mon (m/h/dM/MY/d)>"


def test_time_zones() -> None:
    nine = crontab(0, 9)
    berlin = nine.with_tz("Europe/Berlin")
    assert berlin.next_run(utc(2026, 1, 1)) == utc(2026, 1, 1, 8)
    assert berlin.next_run(utc(2026, 7, 1)) == utc(2026, 7, 1, 7)
    assert nine.tz is UTC and nine.next_run(utc(2026, 1, 1)) == utc(2026, 1, 1, 9)
    assert app_timezone(Settings()) is UTC
    assert app_timezone(Settings(timezone="Europe/Berlin", enable_utc=False)) == BERLIN
    assert app_timezone(SimpleNamespace(timezone=None, enable_utc=False)) is UTC
    with pytest.raises(ValueError, match="timezone"):
        app_timezone(SimpleNamespace(timezone="Mars/Olympus"))
    with pytest.raises(ValueError, match="tz"):
        crontab(tz=object())  # type: ignore[arg-type]


# -- solar -----------------------------------------------------------------------------------


@needs_ephem
def test_solar_times() -> None:
    # Berlin, 2026-06-21: sunrise 04:43 CEST, sunset 21:33 CEST (published almanac times).
    sunrise = solar("sunrise", 52.52, 13.405)
    first = sunrise.next_run(utc(2026, 6, 21))
    assert abs(first - utc(2026, 6, 21, 2, 43)) < timedelta(minutes=2)
    sunset = solar("sunset", 52.52, 13.405).next_run(utc(2026, 6, 21))
    assert abs(sunset - utc(2026, 6, 21, 19, 33)) < timedelta(minutes=2)
    # Greenwich solar noon near the June solstice is about two minutes after 12:00 UTC.
    noon = solar("solar_noon", 51.4779, 0.0).next_run(utc(2026, 6, 21))
    assert abs(noon - utc(2026, 6, 21, 12, 2)) < timedelta(minutes=2)
    # Strictly after: the run after a sunrise is the next day's.
    following = sunrise.next_run(first)
    assert timedelta(hours=23, minutes=58) < following - first < timedelta(hours=24, minutes=2)
    dusk = solar("dusk_astronomical", 40.7, -74.0, nowfun=lambda: utc(2026, 1, 1, 12))
    assert dusk.is_due(utc(2026, 1, 1, 11))[0] is False


@needs_ephem
def test_solar_in_polar_night_runs_at_the_next_real_sunrise() -> None:
    arctic = solar("sunrise", 89.0, 0.0)
    assert arctic.next_run(utc(2026, 12, 21)).date().month == 3


def test_solar_validation() -> None:
    with pytest.raises(ValueError, match="event"):
        solar("noon", 0, 0)
    with pytest.raises(ValueError, match="lat"):
        solar("sunrise", 91, 0)
    with pytest.raises(ValueError, match="lon"):
        solar("sunrise", 0, -181)


def test_solar_without_ephem_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ephem", None)
    with pytest.raises(ImportError, match=r"celeriac\[solar\]"):
        solar("sunrise", 0, 0)


# -- an independent oracle around every 2026 transition of some awkward zones ----------------


def _matches(s: crontab, wall: datetime) -> bool:
    return (wall.minute in s.minute and wall.hour in s.hour and wall.day in s.day_of_month
            and wall.month in s.month_of_year and wall.isoweekday() % 7 in s.day_of_week)


def _oracle(s: crontab, start: datetime, end: datetime) -> list[datetime]:
    """Walk real time minute by minute; fire when local time first reaches a match.

    That is the module's rule restated: a repeated local time is reached once, and the
    local times a gap skips are all reached at the instant after it.
    """
    fires, minute = [], timedelta(minutes=1)
    reached = start.astimezone(s.tz).replace(tzinfo=None)
    at = start
    while (at := at + minute) <= end:
        wall = at.astimezone(s.tz).replace(tzinfo=None)
        new = (reached + minute * i for i in range(1, (wall - reached) // minute + 1))
        if any(_matches(s, w) for w in new):
            fires.append(at)
        reached = max(reached, wall)
    return fires


def _transitions(zone: ZoneInfo) -> list[datetime]:
    hours = [utc(2026, 1, 1) + timedelta(hours=h) for h in range(365 * 24)]
    return [b for a, b in pairwise(hours)
            if a.astimezone(zone).utcoffset() != b.astimezone(zone).utcoffset()]


@pytest.mark.parametrize(
    "zone", ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/Santiago"])
def test_crontab_matches_a_minute_by_minute_oracle(zone: str) -> None:
    # Lord Howe moves its clocks by 30 minutes; Santiago at midnight, so 00:00 is skipped.
    changes = _transitions(ZoneInfo(zone))
    assert len(changes) == 2
    for expression in ("*/15 * * * *", "30 2 * * *", "0 0 * * *", "*/20 1-3 * * *",
                       "45 1 * * *", "15,45 22-23,0-2 * * *", "0 * * * *"):
        s = crontab.from_string(expression, tz=zone)
        for change in changes:
            start, end = change - timedelta(hours=6), change + timedelta(hours=6)
            got, at = [], s.next_run(start)
            while at <= end:
                got.append(at)
                at = s.next_run(at)
            assert got == _oracle(s, start, end), (expression, change)
