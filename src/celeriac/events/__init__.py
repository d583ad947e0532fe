"""Events: what workers and producers broadcast about tasks, and what monitors make of it.

``EventDispatcher`` (sender side) -> the broker's fanout ``celeriac.events`` channel ->
``EventReceiver`` -> handlers, typically ``ClusterState.event``, which ``celeriac
events`` (dump, top, cameras) and the dashboard read. An event is a plain dict; the wire
format (a JSON array of events per broadcast) is described in ``dispatcher``.
"""

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
