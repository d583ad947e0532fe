"""celeriac: a distributed task queue for Python.

::

    from celeriac import Celeriac

    app = Celeriac("proj")

    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    add.delay(2, 3).get(timeout=10)  # 5, once a worker runs: celeriac -A proj worker
"""

from typing import TYPE_CHECKING, Any

from . import signals, states
from .__about__ import __version__
from .app import Celeriac
from .canvas import Signature, chain, chord, chunks, group, signature
from .errors import (
    BrokerError,
    BrokerUnavailable,
    CeleriacError,
    ChordError,
    ConfigurationError,
    ContentDisallowed,
    DecodeError,
    EncodeError,
    Ignore,
    MaxRetriesExceededError,
    MessageTooLarge,
    NotRegistered,
    OperationalError,
    Reject,
    ResultTimeout,
    Retry,
    SerializationError,
    SoftTimeLimitExceeded,
    TaskControl,
    TaskError,
    TaskFailed,
    TaskRevoked,
    TimeLimitExceeded,
    WorkerLostError,
    WorkerShutdown,
    WorkerTerminate,
)
from .hooks import Hooks
from .result import AsyncResult, EagerResult, GroupResult
from .runtime.state import current_app, shared_task
from .settings import Settings
from .tasks import Request, Task

if TYPE_CHECKING:
    from .worker import Worker

__all__ = [
    "AsyncResult",
    "BrokerError",
    "BrokerUnavailable",
    "Celeriac",
    "CeleriacError",
    "ChordError",
    "ConfigurationError",
    "ContentDisallowed",
    "DecodeError",
    "EagerResult",
    "EncodeError",
    "GroupResult",
    "Hooks",
    "Ignore",
    "MaxRetriesExceededError",
    "MessageTooLarge",
    "NotRegistered",
    "OperationalError",
    "Reject",
    "Request",
    "ResultTimeout",
    "Retry",
    "SerializationError",
    "Settings",
    "Signature",
    "SoftTimeLimitExceeded",
    "Task",
    "TaskControl",
    "TaskError",
    "TaskFailed",
    "TaskRevoked",
    "TimeLimitExceeded",
    "Worker",
    "WorkerLostError",
    "WorkerShutdown",
    "WorkerTerminate",
    "__version__",
    "chain",
    "chord",
    "chunks",
    "current_app",
    "group",
    "shared_task",
    "signals",
    "signature",
    "states",
]


def __getattr__(name: str) -> Any:
    # ``celeriac.Worker`` is imported when first asked for: a producer never runs a
    # worker, and the worker's modules (pool, consumer, asyncio) are most of what
    # ``import celeriac`` would cost.
    if name == "Worker":
        from .worker import Worker

        return Worker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
