"""``--health-file``: a local liveness probe that needs no broker round trip.

The worker writes its pid into the file when it starts, and its event loop touches the
file (``os.utime``) every ``worker_health_interval`` seconds on the Timer. So a fresh
file means the loop turns: it runs heartbeats, acks, lease renewal and signals. A long
task does not make it stale (tasks run in pool children, or solo's thread); a wedged
loop, a stopped process or a dead one does. ``celeriac health`` (``cli/health.py``)
reads the age of the file and checks the pid; Celery's ``inspect ping`` goes through
the broker and answers "no nodes replied" for a busy worker, which makes a poor
Kubernetes probe.

The file is written atomically (a temporary file renamed over it), recreated by the next
tick if someone deletes it, and removed when the worker stops, warm or cold.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile

from .blueprint import Step
from .steps import TimerStep
from .timer import Entry

logger = logging.getLogger("celeriac.worker.health")


def write_health_file(path: str) -> None:
    """Write this process's pid to ``path`` (atomically: a reader never sees it half
    written)."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".health-", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()}\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class HealthFile(Step):
    """Touches ``worker.health_file`` every ``worker_health_interval`` seconds."""

    requires = (TimerStep,)

    async def start(self) -> None:
        w = self.worker
        self.path: str | None = getattr(w, "health_file", None)
        self.tick: Entry | None = None
        self.failing = False
        if self.path is None:
            return
        write_health_file(self.path)  # a path we cannot write stops the start, loudly
        interval = w.app.settings.worker_health_interval
        self.tick = w.timer.call_repeatedly(interval, self.touch)
        logger.info("health file %s touched every %gs", self.path, interval)

    def touch(self) -> None:
        assert self.path is not None
        try:
            try:
                os.utime(self.path)
            except FileNotFoundError:
                write_health_file(self.path)
        except OSError as exc:
            # The probe will see the file go stale; say why once, not every tick.
            if not self.failing:
                logger.error("cannot touch health file %s: %s", self.path, exc)
            self.failing = True
            return
        if self.failing:
            logger.warning("health file %s touched again", self.path)
            self.failing = False

    async def stop(self) -> None:
        if self.tick is not None:
            self.tick.cancel()
            self.tick = None
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
