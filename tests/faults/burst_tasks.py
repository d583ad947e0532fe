"""The worker of test_event_burst.py: the integration tasks' app, plus a probe on the
worker's loop that logs each time the loop could not run a timer for a while (``loop
stalled for N ms``), so the test reads the loop's lag from the log."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from celeriac import Hooks
from tests.integration.app_tasks import app

__all__ = ["app"]

logger = logging.getLogger("tests.burst_probe")

TICK = 0.01
"""Seconds between the probe's timer calls."""
REPORTED = 0.02
"""A timer late by more than this is logged."""


class LagProbe(Hooks):
    def after_worker_start(self, worker: Any) -> None:
        loop = asyncio.get_running_loop()
        due = time.monotonic() + TICK

        def tick() -> None:
            nonlocal due
            late = time.monotonic() - due
            if late > REPORTED:
                logger.warning("loop stalled for %d ms", late * 1000)
            due = time.monotonic() + TICK
            loop.call_later(TICK, tick)

        loop.call_later(TICK, tick)


app.add_hooks(LagProbe())
