"""Cameras: periodic snapshots of a ``ClusterState`` (``celeriac events --camera``).

A camera is a class taking ``(state, freq)``; every ``freq`` seconds its ``on_shutter``
gets the state, and ``cleanup`` runs once at the end, after a last shot (so a short run
still records what it saw). Subclass ``Camera`` to store snapshots elsewhere (a
database, a metrics system); ``JSONLinesCamera`` writes them as JSON lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import sys
from typing import IO, Any

import orjson

from .state import ClusterState

logger = logging.getLogger("celeriac.events.cameras")


class Camera:
    """Base camera: override ``on_shutter`` (and ``cleanup`` if it holds resources)."""

    def __init__(self, state: ClusterState, freq: float = 1.0) -> None:
        if freq <= 0:
            raise ValueError(f"camera frequency must be > 0 seconds, got {freq!r}")
        self.state = state
        self.freq = freq
        self.shots = 0

    def on_shutter(self, state: ClusterState) -> None:
        """Called every ``freq`` seconds with the state."""

    def cleanup(self) -> None:
        """Called once when the camera stops."""

    def shutter(self) -> None:
        """Take one shot now; a failing ``on_shutter`` is logged, and the next shot is
        taken as usual (a monitor should outlive one bad write)."""
        try:
            self.on_shutter(self.state)
        except Exception:
            logger.exception("camera %s failed to take a shot", type(self).__name__)
        else:
            self.shots += 1

    async def arun(self, stop: asyncio.Event) -> None:
        """Shoot every ``freq`` seconds on the running loop until ``stop`` is set; then a
        last shot and ``cleanup``."""
        loop = asyncio.get_running_loop()
        next_at = loop.time() + self.freq
        try:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(next_at - loop.time(), 0)):
                        await stop.wait()
                if stop.is_set():
                    break
                self.shutter()
                # Drift-free; after a slow shot skip the missed ones rather than burst.
                next_at = max(next_at + self.freq, loop.time())
        finally:
            self.shutter()
            self.cleanup()


class JSONLinesCamera(Camera):
    """Appends ``state.snapshot()`` as one JSON line per shot to ``output``: a path, an
    open text file, or None / ``"-"`` for standard output."""

    def __init__(self, state: ClusterState, freq: float = 1.0, *,
                 output: str | os.PathLike[str] | IO[str] | None = None,
                 task_limit: int | None = None) -> None:
        super().__init__(state, freq)
        self.task_limit = task_limit
        self._owned = False
        if output is None or output == "-":
            self.output: IO[str] = sys.stdout
        elif isinstance(output, str | os.PathLike):
            self.output = open(output, "a", encoding="utf-8")  # noqa: SIM115 - closed in cleanup
            self._owned = True
        else:
            self.output = output

    def on_shutter(self, state: ClusterState) -> None:
        line = orjson.dumps(state.snapshot(self.task_limit), default=repr,
                            option=orjson.OPT_NON_STR_KEYS)
        self.output.write(line.decode() + "\n")
        self.output.flush()

    def cleanup(self) -> None:
        if self._owned:
            self.output.close()


def load_camera(spec: str) -> type[Camera]:
    """The camera class named ``package.module.Class`` or ``package.module:Class``."""
    module_name, sep, attr = spec.partition(":")
    if not sep:
        module_name, _, attr = spec.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"camera {spec!r}: expected module.Class")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like -A: a camera module beside the app
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"camera {spec!r}: cannot import {module_name!r}: {exc}") from None
    cls: Any = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, Camera)):
        raise ValueError(f"camera {spec!r}: {attr!r} in {module_name!r} is not a "
                         "celeriac.events.Camera subclass")
    return cls
