"""Sun event times for ``celeriac.schedules.solar``, computed with ``ephem`` (the ``solar`` extra).

The horizons and methods are Celery's, so an event fires at the same instant as there.
"""

from __future__ import annotations

import importlib
from datetime import UTC, datetime, timedelta
from types import ModuleType
from typing import NamedTuple


class _Event(NamedTuple):
    method: str  # the ephem.Observer method that finds the next one
    horizon: str  # the sun's altitude at the event, in degrees
    use_center: bool  # twilights are the centre's altitude; sunrise/set the upper limb's


EVENTS = {
    "dawn_astronomical": _Event("next_rising", "-18", True),
    "dawn_nautical": _Event("next_rising", "-12", True),
    "dawn_civil": _Event("next_rising", "-6", True),
    "sunrise": _Event("next_rising", "-0:34", False),  # 34' of atmospheric refraction
    "solar_noon": _Event("next_transit", "0", False),
    "sunset": _Event("next_setting", "-0:34", False),
    "dusk_civil": _Event("next_setting", "-6", True),
    "dusk_nautical": _Event("next_setting", "-12", True),
    "dusk_astronomical": _Event("next_setting", "-18", True),
}

# Near the poles an event can be absent for months; past a year it never comes.
_MAX_DAYS = 400


def require_ephem() -> ModuleType:
    try:
        return importlib.import_module("ephem")
    except ImportError as exc:
        raise ImportError(
            "solar schedules need the 'ephem' package: pip install 'celeriac[solar]'"
        ) from exc


def next_event(event: str, lat: float, lon: float, after: datetime) -> datetime:
    """The first ``event`` strictly after ``after`` (aware) seen from lat/lon, in UTC."""
    eph = require_ephem()
    spec = EVENTS[event]
    observer = eph.Observer()
    observer.lat, observer.lon = str(lat), str(lon)  # strings are degrees, floats radians
    observer.elev, observer.pressure, observer.horizon = 0, 0, spec.horizon
    find = getattr(observer, spec.method)
    kwargs = {"use_center": True} if spec.use_center else {}
    # Recomputing the event that ran last may come out a few milliseconds later than the
    # time it was given as; starting a second on keeps it from running twice.
    start = after.astimezone(UTC).replace(tzinfo=None) + timedelta(seconds=1)
    for _ in range(_MAX_DAYS):
        try:
            found: datetime = find(eph.Sun(), start=start, **kwargs).datetime()
        except eph.CircumpolarError:
            # No such event today: look again after the sun's lowest point (as Celery).
            start = observer.next_antitransit(eph.Sun(), start=start).datetime()
            start += timedelta(minutes=1)
            continue
        return found.replace(tzinfo=UTC)
    raise ValueError(f"solar {event} does not occur at latitude {lat}, longitude {lon}")
