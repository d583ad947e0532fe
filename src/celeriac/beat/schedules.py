"""When periodic tasks run: Celery's ``schedule``, ``crontab`` and ``solar``.

Names, field syntax and semantics follow ``celery.schedules`` so a Celery ``beat_schedule``
means the same thing here. Where Celery and classic cron disagree we follow Celery:

* ``day_of_month`` and ``day_of_week`` must *both* match (AND). Cron runs a job when
  *either* matches if both are restricted, so ``0 0 13 * fri`` is "every Friday the 13th"
  here and "every 13th and every Friday" in cron.
* Ranges may wrap (``fri-mon`` is fri,sat,sun,mon) and days of the week are 0-6, Sunday 0.

What is ours: every time is timezone-aware (a naive datetime is refused, never guessed),
``next_run`` returns UTC so that comparing and subtracting results is real time, and each
schedule carries its zone (``tz``) instead of reading a global app. A crontab fires once
per matching local wall-clock time, across daylight-saving changes (see ``_resolve``);
an interval is real elapsed time. ``to_dict``/``from_dict`` give a JSON form for a shared
schedule store.
"""

from __future__ import annotations

import calendar
import copy
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import MAXYEAR, UTC, date, datetime, time, timedelta, timezone, tzinfo
from typing import Any, NamedTuple, Self
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from . import solar as _solar

__all__ = ["BaseSchedule", "app_timezone", "crontab", "from_dict", "maybe_schedule",
           "schedstate", "schedule", "solar"]

Zone = ZoneInfo | timezone
Cronspec = int | str | Iterable[int]

# An impossible crontab is refused at definition, so this bound is only a guarantee that
# the search ends: any possible month/day pair meets every weekday within 40 years.
_SEARCH_YEARS = 50


class schedstate(NamedTuple):  # Celery's name and fields
    is_due: bool
    next: float  # seconds until beat should ask again


def _aware(dt: datetime, name: str) -> datetime:
    if not isinstance(dt, datetime):
        raise TypeError(f"{name} must be a datetime, not {dt!r}")
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware, got naive {dt!r}")
    return dt.astimezone(UTC)


def _zone(tz: tzinfo | str | None, name: str = "tz") -> Zone:
    if tz is None:
        return UTC
    if isinstance(tz, str):
        try:
            return UTC if tz.upper() == "UTC" else ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"{name}: unknown time zone {tz!r}") from exc
    if tz is UTC or (isinstance(tz, ZoneInfo) and tz.key):
        return tz
    raise ValueError(f"{name} must be a zoneinfo.ZoneInfo or datetime.timezone.utc, not {tz!r}")


def _zone_name(tz: Zone) -> str:
    return tz.key if isinstance(tz, ZoneInfo) else "UTC"


def app_timezone(settings: Any) -> Zone:
    """The zone beat binds schedules to: ``settings.timezone`` if set, else UTC.

    Celery falls back to the host's local zone when ``enable_utc`` is off and no
    ``timezone`` is set; we use UTC there too, so a schedule never depends on the host.
    """
    return _zone(getattr(settings, "timezone", None), "timezone")


def _resolve(wall: datetime, tz: Zone, fold: int = 0) -> datetime:
    """The UTC instant of naive local time ``wall``, under the DST rules of this module.

    A wall time that occurs twice (clocks fall back) means its first occurrence (fold=0)
    unless ``fold`` says otherwise; one that never occurs (clocks spring forward) means
    the first instant after the gap. Both keep a crontab to one run per local time.
    """
    instant = wall.replace(tzinfo=tz, fold=fold).astimezone(UTC)
    if instant.astimezone(tz).replace(tzinfo=None) == wall:
        return instant
    # In a gap: fold=1 reads ``wall`` with the offset after the change, which lands
    # before the change, and fold=0 with the offset before it, which lands after. The
    # change itself (a whole second in every zone) lies in between: bisect for it.
    lo = int(wall.replace(tzinfo=tz, fold=1).timestamp())
    hi = int(wall.replace(tzinfo=tz, fold=0).timestamp())
    after = datetime.fromtimestamp(hi, tz).utcoffset()
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if datetime.fromtimestamp(mid, tz).utcoffset() == after:
            hi = mid
        else:
            lo = mid
    return datetime.fromtimestamp(hi, UTC)


class BaseSchedule:
    """What beat needs from a schedule; times in and out are timezone-aware."""

    _type = ""  # the "type" in to_dict

    def __init__(
        self, *, tz: tzinfo | str | None = None, nowfun: Callable[[], datetime] | None = None
    ) -> None:
        self.tz: Zone = _zone(tz)
        self.nowfun = nowfun

    def now(self) -> datetime:
        """The current time, in UTC."""
        if self.nowfun is None:
            return datetime.now(UTC)
        return _aware(self.nowfun(), "nowfun()")

    def next_run(self, after: datetime) -> datetime:
        """The first run strictly after ``after``, in UTC."""
        raise NotImplementedError

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        """Time from now until the run that follows ``last_run_at`` (negative if overdue)."""
        # Both sides in UTC: Python subtracts same-zone datetimes by wall clock.
        return self.next_run(_aware(last_run_at, "last_run_at")) - self.now()

    def is_due(self, last_run_at: datetime) -> schedstate:
        """Celery's ``(is_due, next)``: due now?, and seconds until the next check."""
        remaining = self.remaining_estimate(last_run_at).total_seconds()
        if remaining > 0:
            return schedstate(False, remaining)
        now = self.now()
        return schedstate(True, (self.next_run(now) - now).total_seconds())

    def with_tz(self, tz: tzinfo | str | None) -> Self:
        """This schedule read in zone ``tz`` (beat binds the app's zone with it)."""
        bound = copy.copy(self)
        bound.tz = _zone(tz)
        return bound

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form; :func:`from_dict` turns it back into an equal schedule."""
        return {"type": self._type, **self._fields(), "tz": _zone_name(self.tz)}

    def _fields(self) -> dict[str, Any]:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BaseSchedule):
            return NotImplemented
        return type(self) is type(other) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple[Any, ...]:
        return (*self._fields().values(), _zone_name(self.tz))


class schedule(BaseSchedule):
    """Run every ``run_every`` (seconds or timedelta) of real elapsed time.

    With ``relative=True`` the next run is rounded down to the interval's resolution on the
    local clock (a 1-hour interval runs on the hour), as in Celery.
    """

    _type = "interval"

    def __init__(
        self,
        run_every: timedelta | float,
        relative: bool = False,
        *,
        tz: tzinfo | str | None = None,
        nowfun: Callable[[], datetime] | None = None,
    ) -> None:
        if isinstance(run_every, bool) or not isinstance(run_every, int | float | timedelta):
            raise TypeError(f"schedule run_every must be seconds or a timedelta: {run_every!r}")
        seconds = run_every.total_seconds() if isinstance(run_every, timedelta) else run_every
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"schedule run_every must be positive, got {run_every!r}")
        super().__init__(tz=tz, nowfun=nowfun)
        self.run_every = timedelta(seconds=seconds)
        self.relative = relative

    @property
    def seconds(self) -> float:
        return self.run_every.total_seconds()

    def next_run(self, after: datetime) -> datetime:
        # Real elapsed time: add in UTC, never on a local clock that jumps.
        after = _aware(after, "after")
        end = after + self.run_every
        if not self.relative:
            return end
        local = end.astimezone(self.tz)
        # Celery's delta_resolution: drop the units finer than the interval.
        wall = local.replace(tzinfo=None, microsecond=0)
        if self.seconds >= 60:
            wall = wall.replace(second=0)
        if self.seconds >= 3600:
            wall = wall.replace(minute=0)
        if self.seconds >= 86400:
            wall = wall.replace(hour=0)
        rounded = _resolve(wall, self.tz, local.fold)
        # Rounding back over a clock change can land on or before ``after``; then the
        # unrounded time keeps the run strictly later.
        return rounded if rounded > after else end

    def _fields(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "relative": self.relative}

    def __repr__(self) -> str:
        return f"<freq: {_humanize(self.seconds)}>"


def _humanize(seconds: float) -> str:
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        if seconds >= size:
            n = seconds / size
            return f"{n:.2f} {unit}{'' if n == 1 else 's'}"
    return f"{seconds:.2f} seconds"


def _names(*names: str, first: int) -> dict[str, int]:
    """Full names and their three-letter abbreviations, numbered from ``first``."""
    return {key: i for i, n in enumerate(names, first) for key in (n, n[:3])}


_DAYS = _names("sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday",
               first=0)
_MONTHS = _names("january", "february", "march", "april", "may", "june", "july", "august",
                 "september", "october", "november", "december", first=1)
_PART = re.compile(r"^(?:(\*)|(\w+)(?:-(\w+))?)(?:/(\w*))?$", re.ASCII)


class _Field(NamedTuple):
    name: str
    lo: int
    hi: int
    names: Mapping[str, int]

    def parse(self, spec: Cronspec) -> tuple[tuple[int, ...], str]:
        """The sorted values ``spec`` matches, and ``spec`` as a string for ``to_dict``."""
        if isinstance(spec, bool):
            raise TypeError(f"crontab {self.name}: expected int, str or ints, got {spec!r}")
        if isinstance(spec, int):
            return (self._check(spec),), str(spec)
        if isinstance(spec, str):
            return self._parse_str(spec), spec
        if isinstance(spec, Iterable):
            values = sorted({self._check(v) for v in spec})
            if not values:
                raise ValueError(f"crontab {self.name}: empty set of values")
            return tuple(values), ",".join(map(str, values))
        raise TypeError(f"crontab {self.name}: expected int, str or ints, got {spec!r}")

    def _check(self, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"crontab {self.name}: {value!r} is not an int")
        if not self.lo <= value <= self.hi:
            raise ValueError(f"crontab {self.name}: {value} is out of range {self.lo}-{self.hi}")
        return value

    def _parse_str(self, spec: str) -> tuple[int, ...]:
        if not spec.strip():
            raise ValueError(f"crontab {self.name}: empty expression")
        values: set[int] = set()
        for part in spec.replace(" ", "").split(","):
            match = _PART.match(part)
            if not match:
                raise ValueError(f"crontab {self.name}: cannot parse {part!r} in {spec!r}")
            star, first, last, step = match.groups()
            start = self.lo if star else self._number(first)
            # ``a/n`` (cron's extension, which Celery refuses) runs from a to the top.
            stop = self.hi if star or (step is not None and last is None) else start
            stop = self._number(last) if last else stop
            # Celery lets a range wrap past the top: ``fri-mon``, ``50-10``.
            span = list(range(start, stop + 1)) if start <= stop else [
                *range(start, self.hi + 1), *range(self.lo, stop + 1)]
            values.update(span[:: self._step(step, part)])
        return tuple(sorted(values))

    def _step(self, step: str | None, part: str) -> int:
        if step is None:
            return 1
        if not step.isdigit() or int(step) == 0:
            raise ValueError(f"crontab {self.name}: step in {part!r} must be a positive integer")
        return int(step)

    def _number(self, token: str) -> int:
        if token.isdigit():
            return self._check(int(token))
        if token.lower() in self.names:
            return self.names[token.lower()]
        raise ValueError(f"crontab {self.name}: {token!r} is not a number or a valid name")


_MINUTE = _Field("minute", 0, 59, {})
_HOUR = _Field("hour", 0, 23, {})
_DAY_OF_WEEK = _Field("day_of_week", 0, 6, _DAYS)
_DAY_OF_MONTH = _Field("day_of_month", 1, 31, {})
_MONTH_OF_YEAR = _Field("month_of_year", 1, 12, _MONTHS)


class crontab(BaseSchedule):
    """Run at local wall-clock times matching every field (Celery's crontab).

    Days of the week are 0-6 from Sunday, or names (``mon-fri``); a day must match
    ``day_of_month``, ``day_of_week`` and ``month_of_year`` all at once.
    """

    _type = "crontab"

    def __init__(
        self,
        minute: Cronspec = "*",
        hour: Cronspec = "*",
        day_of_week: Cronspec = "*",
        day_of_month: Cronspec = "*",
        month_of_year: Cronspec = "*",
        *,
        tz: tzinfo | str | None = None,
        nowfun: Callable[[], datetime] | None = None,
    ) -> None:
        super().__init__(tz=tz, nowfun=nowfun)
        self.minute, self._orig_minute = _MINUTE.parse(minute)
        self.hour, self._orig_hour = _HOUR.parse(hour)
        self.day_of_week, self._orig_day_of_week = _DAY_OF_WEEK.parse(day_of_week)
        self.day_of_month, self._orig_day_of_month = _DAY_OF_MONTH.parse(day_of_month)
        self.month_of_year, self._orig_month_of_year = _MONTH_OF_YEAR.parse(month_of_year)
        # Celery would search forever for February 30th; refuse it now instead.
        if not any(d <= calendar.monthrange(2000, m)[1]  # 2000: February has 29 days
                   for m in self.month_of_year for d in self.day_of_month):
            raise ValueError(
                f"crontab day_of_month: {self._orig_day_of_month!r} never occurs in "
                f"month_of_year {self._orig_month_of_year!r}"
            )

    @classmethod
    def from_string(cls, expression: str, **kwargs: Any) -> crontab:
        """``crontab.from_string("*/5 * * * *")``: minute hour day-of-month month day-of-week."""
        fields = expression.split()
        if len(fields) != 5:
            raise ValueError(f"crontab expression must have 5 fields, got {expression!r}")
        minute, hour, day_of_month, month_of_year, day_of_week = fields
        return cls(minute, hour, day_of_week, day_of_month, month_of_year, **kwargs)

    def next_run(self, after: datetime) -> datetime:
        after = _aware(after, "after")
        local = after.astimezone(self.tz)
        start = local.replace(second=0, microsecond=0, tzinfo=None) + timedelta(minutes=1)
        # Local wall time maps to real time monotonically under _resolve, so the first
        # candidate that lands after ``after`` is the answer. The candidates skipped are
        # at most the repeated hour, when ``after`` is in its second occurrence.
        instants = (_resolve(wall, self.tz) for wall in self._walls(start))
        return next(instant for instant in instants if instant > after)

    def _walls(self, start: datetime) -> Iterator[datetime]:
        """Matching local wall-clock minutes from ``start`` on, in order."""
        for day in self._days(start.date()):
            first_day = day == start.date()
            for hour in self.hour:
                if first_day and hour < start.hour:
                    continue
                for minute in self.minute:
                    if first_day and hour == start.hour and minute < start.minute:
                        continue
                    yield datetime.combine(day, time(hour, minute))

    def _days(self, first: date) -> Iterator[date]:
        """Matching days from ``first`` on, walked month by month."""
        for year in range(first.year, min(first.year + _SEARCH_YEARS, MAXYEAR + 1)):
            for month in self.month_of_year:
                if (year, month) < (first.year, first.month):
                    continue
                days_in_month = calendar.monthrange(year, month)[1]
                for dom in self.day_of_month:
                    if dom > days_in_month:
                        break
                    day = date(year, month, dom)
                    # Celery's AND: day of month, month and day of week all match.
                    if day >= first and day.isoweekday() % 7 in self.day_of_week:
                        yield day
        raise ValueError(f"{self!r} has no run within {_SEARCH_YEARS} years of {first}")

    def _fields(self) -> dict[str, Any]:
        return {
            "minute": self._orig_minute,
            "hour": self._orig_hour,
            "day_of_week": self._orig_day_of_week,
            "day_of_month": self._orig_day_of_month,
            "month_of_year": self._orig_month_of_year,
        }

    def _key(self) -> tuple[Any, ...]:
        # Celery compares the expanded values: "*/30" equals "0,30".
        return (self.minute, self.hour, self.day_of_week, self.day_of_month,
                self.month_of_year, _zone_name(self.tz))

    def __repr__(self) -> str:
        return (
            f"<crontab: {self._orig_minute} {self._orig_hour} {self._orig_day_of_month} "
            f"{self._orig_month_of_year} {self._orig_day_of_week} (m/h/dM/MY/d)>"
        )


class solar(BaseSchedule):
    """Run at a solar event (``sunrise``, ``dusk_civil``...) seen from latitude/longitude.

    Needs the ``solar`` extra (``ephem``); ``tz`` is stored but cannot move the sun. Unlike
    Celery, where the sun does not rise or set for a while (polar day or night), the next
    run is the event's next real occurrence, not a time to check again.
    """

    _type = "solar"

    def __init__(
        self,
        event: str,
        lat: float,
        lon: float,
        *,
        tz: tzinfo | str | None = None,
        nowfun: Callable[[], datetime] | None = None,
    ) -> None:
        if event not in _solar.EVENTS:
            raise ValueError(
                f"solar event: {event!r} is not one of {', '.join(sorted(_solar.EVENTS))}"
            )
        for name, value, limit in (("lat", lat, 90), ("lon", lon, 180)):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"solar {name} must be a number, got {value!r}")
            if not -limit <= value <= limit:
                raise ValueError(f"solar {name}: {value} is out of range {-limit}-{limit}")
        _solar.require_ephem()  # fail at definition, naming the extra, if it is missing
        super().__init__(tz=tz, nowfun=nowfun)
        self.event, self.lat, self.lon = event, lat, lon

    def next_run(self, after: datetime) -> datetime:
        return _solar.next_event(self.event, self.lat, self.lon, _aware(after, "after"))

    def _fields(self) -> dict[str, Any]:
        return {"event": self.event, "lat": self.lat, "lon": self.lon}

    def __repr__(self) -> str:
        return f"<solar: {self.event} at latitude {self.lat}, longitude: {self.lon}>"


def maybe_schedule(value: BaseSchedule | timedelta | float) -> BaseSchedule:
    """Celery's coercion: seconds or a timedelta become a :class:`schedule`."""
    if isinstance(value, BaseSchedule):
        return value
    if isinstance(value, timedelta | int | float) and not isinstance(value, bool):
        return schedule(value)
    raise TypeError(f"cannot make a schedule from {value!r}: give seconds, a timedelta "
                    "or a schedule")


def from_dict(d: Mapping[str, Any]) -> BaseSchedule:
    """The schedule that :meth:`BaseSchedule.to_dict` described."""
    kind = d.get("type")
    tz = d.get("tz")
    try:
        if kind == "interval":
            return schedule(d["seconds"], d.get("relative", False), tz=tz)
        if kind == "crontab":
            fields = ("minute", "hour", "day_of_week", "day_of_month", "month_of_year")
            return crontab(**{f: d.get(f, "*") for f in fields}, tz=tz)
        if kind == "solar":
            return solar(d["event"], d["lat"], d["lon"], tz=tz)
    except KeyError as exc:
        raise ValueError(f"{kind} schedule dict is missing {exc}: {dict(d)!r}") from None
    raise ValueError(f"schedule dict type must be interval, crontab or solar, got {kind!r}")
