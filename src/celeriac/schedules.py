"""``celeriac.schedules``: Celery's ``celery.schedules`` path, for configuration files
(``from celeriac.schedules import crontab``). The schedules live with beat
(``celeriac.beat.schedules``); these are the same objects."""

from .beat.schedules import (
    BaseSchedule,
    app_timezone,
    crontab,
    from_dict,
    maybe_schedule,
    schedstate,
    schedule,
    solar,
)

__all__ = ["BaseSchedule", "app_timezone", "crontab", "from_dict", "maybe_schedule",
           "schedstate", "schedule", "solar"]
