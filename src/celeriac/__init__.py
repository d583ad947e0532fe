"""celeriac: a distributed task queue for Python.

::

    from celeriac import Celeriac

    app = Celeriac("proj")

    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    add.delay(2, 3).get(timeout=10)  # 5, once a worker runs: celeriac -A proj worker
"""

import sys

from .__about__ import __version__

# ``typing`` is not imported here: it is most of what a bare ``import celeriac`` would cost.
# Type checkers take any ``TYPE_CHECKING`` as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

    from . import signals, states
    from .app import Celeriac
    from .canvas import Signature, chain, chord, chunks, group
    from .canvas.signature import signature
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


_ERRORS = (
    "BrokerError", "BrokerUnavailable", "CeleriacError", "ChordError", "ConfigurationError",
    "ContentDisallowed", "DecodeError", "EncodeError", "Ignore", "MaxRetriesExceededError",
    "MessageTooLarge", "NotRegistered", "OperationalError", "Reject", "ResultTimeout", "Retry",
    "SerializationError", "SoftTimeLimitExceeded", "TaskControl", "TaskError", "TaskFailed",
    "TaskRevoked", "TimeLimitExceeded", "WorkerLostError", "WorkerShutdown", "WorkerTerminate",
)
_WHERE: dict[str, str] = {
    **dict.fromkeys(_ERRORS, "errors"),
    **dict.fromkeys(("Signature", "chain", "chord", "chunks", "group", "signature"), "canvas"),
    **dict.fromkeys(("AsyncResult", "EagerResult", "GroupResult"), "result"),
    **dict.fromkeys(("current_app", "shared_task"), "runtime.state"),
    **dict.fromkeys(("Request", "Task"), "tasks"),
    "Celeriac": "app", "Hooks": "hooks", "Settings": "settings", "Worker": "worker",
}
"""Where each public name lives (``signals`` and ``states`` are submodules)."""


def _submodule(name: str) -> "ModuleType":
    __import__(f"{__name__}.{name}")
    return sys.modules[f"{__name__}.{name}"]


def __getattr__(name: str) -> "Any":
    # Each public name is imported when first asked for (PEP 562), so ``import celeriac``
    # costs next to nothing: a producer loads the app, tasks and canvas on its first
    # ``from celeriac import Celeriac``, and never the worker (pool, consumer, asyncio).
    if name in ("signals", "states"):
        return _submodule(name)
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if where != "errors":
        # The app registers itself as the default app (runtime.state) as it is imported,
        # which every name but the exceptions may need (a task sent with no app made).
        _submodule("app")
    value = getattr(_submodule(where), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
