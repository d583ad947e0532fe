"""Celery's rate-limit syntax (``"10/s"``, ``"10/m"``, ``"10/h"``, a number per second):
checked where settings and task options are made, used by the worker's rate limiter
(``worker/ratelimit.py``, which re-exports it) and the dashboard's rate-limit action."""

from __future__ import annotations

import math

UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
ACCEPTED = ('a number of tasks per second (10, 0.5), "N/s", "N/m" or "N/h"; '
            'None or 0 for no limit')


def parse_rate(value: str | float | int | None) -> float | None:
    """Tokens per second for a rate limit in Celery's syntax; None for no limit.

    ``10`` or ``"10"`` or ``"10/s"``: ten per second; ``"10/m"``: per minute; ``"10/h"``:
    per hour. None, 0 and ``"0/m"`` mean no limit. Anything else raises ``ValueError``.
    """
    if value is None:
        return None
    per_second: float | None = None
    if isinstance(value, bool):  # an int to Python, but surely a mistake here
        pass
    elif isinstance(value, int | float):
        per_second = float(value)
    elif isinstance(value, str):
        count, _, unit = value.partition("/")
        factor = UNITS.get(unit.strip() or "s")
        try:
            number = float(count)
        except ValueError:
            number = math.nan
        if factor is not None:
            per_second = number / factor
    if per_second is None or not math.isfinite(per_second) or per_second < 0:
        raise ValueError(f"invalid rate limit {value!r}: expected {ACCEPTED}")
    return per_second or None
