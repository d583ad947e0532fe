"""Events: what workers and producers broadcast about tasks, and what monitors make of it.

``EventDispatcher`` (sender side) -> the broker's fanout ``celeriac.events`` channel ->
``EventReceiver`` -> handlers, typically ``ClusterState.event``, which ``celeriac
events`` (dump, top, cameras) and the dashboard read. An event is a plain dict; the wire
format (a JSON array of events per broadcast) is described in ``dispatcher``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cameras import Camera, JSONLinesCamera
    from .clock import LamportClock
    from .dispatcher import EVENTS_CHANNEL, Event, EventDispatcher
    from .receiver import EventReceiver
    from .state import ClusterState, TaskState, WorkerState

__all__ = [
    "EVENTS_CHANNEL",
    "Camera",
    "ClusterState",
    "Event",
    "EventDispatcher",
    "EventReceiver",
    "JSONLinesCamera",
    "LamportClock",
    "TaskState",
    "WorkerState",
]

_WHERE = {
    "Camera": "cameras", "JSONLinesCamera": "cameras", "LamportClock": "clock",
    "EVENTS_CHANNEL": "dispatcher", "Event": "dispatcher", "EventDispatcher": "dispatcher",
    "EventReceiver": "receiver", "ClusterState": "state", "TaskState": "state",
    "WorkerState": "state",
}


def __getattr__(name: str) -> Any:
    # Each name is imported when first asked for (PEP 562): a worker or a producer sending
    # events needs the dispatcher, not the cluster state or the cameras monitors use.
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value
