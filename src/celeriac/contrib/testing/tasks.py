"""The task the test workers answer a ping check with: ``celery.ping`` (Celery's name),
a shared task, so every app has it."""

from __future__ import annotations

from typing import Any

from ...runtime.state import shared_task

PING = "celery.ping"


def _ping() -> str:
    """Answer a test worker's ping check."""
    return "pong"


ping: Any = shared_task(_ping, name=PING)
