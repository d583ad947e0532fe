"""Tasks of the rate-limit tests (test_rate_limit.py), run by real worker processes.

Each returns when it started and finished (wall clock), so that the test reads the
times from the result store on Redis.
"""

from __future__ import annotations

import time

from celeriac import Celeriac, Settings

app = Celeriac("ratelimit", settings=Settings.from_env())


def _times() -> tuple[float, float]:
    started = time.time()
    sum(range(10_000))  # a little work between start and finish
    return started, time.time()


@app.task(rate_limit="10/s")
def limited(i: int) -> tuple[float, float]:
    return _times()


@app.task
def free(i: int) -> tuple[float, float]:
    return _times()


@app.task(rate_limit="2/s")
def trickle(i: int) -> tuple[float, float]:
    return _times()
