"""Cooperative aborts asked of tasks running in this process.

A revoke with terminate cannot stop a sync task running in a thread (nothing kills a
thread): the threads pool asks it instead, here, and ``AbortableTask.is_aborted()``
(``celeriac.contrib.abortable``) answers True from this set before it asks the result
backend. A task that looks stops itself; the pool then ends it ``REVOKED``. Free of
worker imports: the task side reads it wherever it runs.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_requested: set[str] = set()


def request(task_id: str) -> None:
    """Ask running task ``task_id`` to stop (it sees it in ``is_aborted()``)."""
    with _lock:
        _requested.add(task_id)


def requested(task_id: str) -> bool:
    """Whether task ``task_id`` was asked to stop and has not ended since."""
    return task_id in _requested  # a set's membership test is atomic under the GIL


def clear(task_id: str) -> bool:
    """Forget ``task_id`` as its run ends; True if an abort had been asked."""
    with _lock:
        if task_id in _requested:
            _requested.discard(task_id)
            return True
        return False


__all__ = ["clear", "request", "requested"]
