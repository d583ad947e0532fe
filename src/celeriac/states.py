"""Task states, and which of them are final."""

from __future__ import annotations

from typing import Final

PENDING: Final = "PENDING"
"""Unknown to the result backend: waiting, or never sent, or its result expired."""
RECEIVED: Final = "RECEIVED"
"""A worker took the message (reported by events)."""
STARTED: Final = "STARTED"
"""A worker began executing it (stored when ``task_track_started`` is on)."""
SUCCESS: Final = "SUCCESS"
FAILURE: Final = "FAILURE"
RETRY: Final = "RETRY"
"""It failed and was published again to run later."""
REVOKED: Final = "REVOKED"
"""It was revoked or expired before it ran."""

ALL_STATES: Final = frozenset({PENDING, RECEIVED, STARTED, SUCCESS, FAILURE, RETRY, REVOKED})
READY_STATES: Final = frozenset({SUCCESS, FAILURE, REVOKED})
UNREADY_STATES: Final = ALL_STATES - READY_STATES
EXCEPTION_STATES: Final = frozenset({FAILURE, RETRY, REVOKED})
