"""Celery's ``celery.exceptions`` under celeriac's name: ``from celeriac.exceptions import
SoftTimeLimitExceeded, Reject, TimeoutError`` works after the rename.

A re-export, never a second class: each name here is the class of ``celeriac.errors``
that stands for the same thing (``TimeoutError is errors.ResultTimeout``), so an
``except`` written with either name catches what celeriac raises. Celery's names for
which celeriac has no such thing raise an ``ImportError`` that says why and what to use
instead (``_ABSENT``).

========================== =================================================
Celery's name              celeriac's class (``celeriac.errors``)
========================== =================================================
``CeleryError``            ``CeleriacError`` (after the rename: ``CeleriacError``)
``ImproperlyConfigured``   ``ConfigurationError``
``OperationalError``       ``OperationalError``
``TaskPredicate``          ``TaskControl`` (``Retry``, ``Reject``, ``Ignore``)
``TaskError``              ``TaskError``
``NotRegistered``          ``NotRegistered``
``IncompleteStream``       ``IncompleteStream``
``TimeoutError``           ``ResultTimeout``
``MaxRetriesExceededError`` ``MaxRetriesExceededError``
``TaskRevokedError``       ``TaskRevoked``
``InvalidTaskError``       ``DecodeError`` (a message a worker cannot carry out)
``QueueNotFound``          ``ConfigurationError`` (an undeclared queue, not created)
``ChordError``             ``ChordError``
``SoftTimeLimitExceeded``, ``TimeLimitExceeded``, ``WorkerLostError``: the same names
``WorkerShutdown``, ``WorkerTerminate``: the same names
========================== =================================================
"""

from __future__ import annotations

from types import TracebackType
from typing import NoReturn

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
    IncompleteStream,
    MaxRetriesExceededError,
    NotRegistered,
    OperationalError,
    Reject,
    ResultTimeout,
    Retry,
    SecurityError,
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

ImproperlyConfigured = ConfigurationError
TaskPredicate = TaskControl
TimeoutError = ResultTimeout  # Celery's name; it shadows the builtin here, as in Celery
TaskRevokedError = TaskRevoked
InvalidTaskError = DecodeError
QueueNotFound = ConfigurationError
"""Sending to a queue ``task_queues`` does not declare, with
``task_create_missing_queues=False``, is a ``ConfigurationError`` naming the queue."""


def reraise(tp: type[BaseException], value: BaseException,
            tb: TracebackType | None = None) -> NoReturn:
    """Raise ``value`` again with traceback ``tb`` (Celery's helper)."""
    if value.__traceback__ is not tb:
        raise value.with_traceback(tb)
    raise value


_WARNINGS = ("celeriac issues no warnings of its own (it logs, once, what it ignores), so "
             "there is nothing of this category to filter or catch; drop the filter")
_BACKEND = ("celeriac's result backends fail with OperationalError (cannot reach the "
            "store), EncodeError or DecodeError (the value); catch those")
_ABSENT: dict[str, str] = {
    "CeleriacWarning": _WARNINGS,
    "AlwaysEagerIgnored": _WARNINGS,
    "DuplicateNodenameWarning": _WARNINGS,
    "FixupWarning": _WARNINGS,
    "NotConfigured": _WARNINGS,
    "SecurityWarning": _WARNINGS,
    "CPendingDeprecationWarning": _WARNINGS,
    "CDeprecationWarning": _WARNINGS,
    "AlreadyRegistered": ("registering a task name twice is not an error in celeriac (the "
                          "later definition wins, with a warning in the log)"),
    "BackendError": _BACKEND,
    "BackendGetMetaError": _BACKEND,
    "BackendStoreError": _BACKEND,
    "Terminated": ("a task terminated by revoke(terminate=True) ends REVOKED: get() raises "
                   "TaskRevokedError (celeriac.errors.TaskRevoked)"),
    "CeleriacCommandException": ("the command line raises click's exceptions; a celeriac "
                                 "error reaching it is reported with exit status 1"),
}


def __getattr__(name: str) -> NoReturn:
    reason = _ABSENT.get(name)
    if reason is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    raise ImportError(f"celeriac.exceptions.{name} (Celery's celery.exceptions.{name}) is "
                      f"not provided: {reason}", name=__name__)


__all__ = [
    "BrokerError",
    "BrokerUnavailable",
    "CeleriacError",
    "ChordError",
    "ContentDisallowed",
    "DecodeError",
    "EncodeError",
    "Ignore",
    "ImproperlyConfigured",
    "IncompleteStream",
    "InvalidTaskError",
    "MaxRetriesExceededError",
    "NotRegistered",
    "OperationalError",
    "QueueNotFound",
    "Reject",
    "Retry",
    "SecurityError",
    "SerializationError",
    "SoftTimeLimitExceeded",
    "TaskError",
    "TaskFailed",
    "TaskPredicate",
    "TaskRevokedError",
    "TimeLimitExceeded",
    "TimeoutError",
    "WorkerLostError",
    "WorkerShutdown",
    "WorkerTerminate",
    "reraise",
]
