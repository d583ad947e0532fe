"""Every exception celeriac raises, in one tree.

::

    CeleriacError
    ├── ConfigurationError          a setting, URL or argument is wrong
    ├── NotRegistered               no task with that name in this app
    ├── SerializationError
    │   ├── EncodeError             a producer's arguments cannot be serialized
    │   └── DecodeError             a message body or result cannot be decoded
    │       ├── ContentDisallowed   the content type is not in ``accept_content``
    │       └── SecurityError       a signed message's signature is missing or wrong
    ├── BrokerError
    │   ├── OperationalError        the broker failed an operation after retries
    │   │   ├── BrokerUnavailable   the broker cannot be reached
    │   │   └── BrokerLost          the broker's file went away under a worker: it stops
    │   └── MessageTooLarge         the message exceeds ``max_message_size``
    ├── TaskError                   raised by ``AsyncResult.get()`` and inside tasks
    │   ├── TaskFailed              a remote exception that is not re-created locally
    │   ├── TaskRevoked             the task was revoked or expired before it ran
    │   ├── WorkerLostError         the process running the task died
    │   ├── TimeLimitExceeded       the hard time limit killed the task
    │   ├── SoftTimeLimitExceeded   raised inside a task at its soft time limit
    │   ├── MaxRetriesExceededError ``retry()`` past ``max_retries``
    │   └── ChordError              a chord's header task failed: its body did not run
    ├── ControlError                a remote-control command is malformed or refused
    ├── ResultTimeout               ``AsyncResult.get()`` timed out (also a TimeoutError)
    ├── IncompleteStream            ``collect()`` reached a result that is not ready
    └── TaskControl                 control flow raised by tasks, not failures
        ├── Retry                   run again later (``self.retry()``)
        ├── Reject                  refuse the message (dead-letter or requeue)
        └── Ignore                  finish without storing a state

    BaseException
    └── WorkerShutdown              asks a worker to stop (warm); not an Exception
        └── WorkerTerminate         asks a worker to stop now (cold)
"""

from __future__ import annotations

from datetime import datetime
from typing import Any


class CeleriacError(Exception):
    """Base class of every celeriac error."""


class ConfigurationError(CeleriacError):
    """A setting, a URL or an argument is invalid."""


class NotRegistered(CeleriacError, KeyError):
    """No task with this name is registered in the app."""

    def __str__(self) -> str:
        return f"task {self.args[0]!r} is not registered" if self.args else "task not registered"


class SerializationError(CeleriacError):
    """Data could not be serialized or deserialized."""


class EncodeError(SerializationError):
    """A value could not be serialized; nothing was published."""


class DecodeError(SerializationError):
    """A message body or a stored result could not be decoded."""


class ContentDisallowed(DecodeError):
    """The content type is not listed in ``accept_content``."""


class SecurityError(DecodeError):
    """A signed message (the ``auth`` serializer) is unsigned, tampered with, or signed
    by a key or certificate this process does not trust."""


class BrokerError(CeleriacError):
    """The broker refused or failed an operation."""


class OperationalError(BrokerError):
    """The broker failed an operation, after the retries ``broker_connection_retry`` allows.

    The message says which URL failed and why."""


class BrokerUnavailable(OperationalError):
    """The broker cannot be reached."""


class BrokerLost(OperationalError):
    """What the broker holds is gone for good under a running worker (the SQLite file
    was deleted or replaced): not an outage to wait out, since whatever the worker wrote
    from then on would land where no other process looks. The worker stops, non-zero."""


class MessageTooLarge(BrokerError):
    """The message is larger than ``max_message_size``; nothing was published."""


class TaskError(CeleriacError):
    """A task did not complete successfully."""


class TaskFailed(TaskError):
    """A task raised an exception that is not re-created on this side.

    Remote exceptions are re-raised with their own type when the reader has that type
    (builtins, celeriac's own, ``result_exception_allowlist``, or a class whose module
    the reader has imported already); any other type arrives as ``TaskFailed`` carrying
    its name, message and traceback. Nothing is imported on the word of stored data.

    It is also Celery's ``UnpickleableExceptionWrapper`` (the same concept: a remote
    exception not re-created here; ``celeriac.utils.serialization``), with that class's
    attributes: ``exc_module``, ``exc_cls_name``, ``exc_args`` (the exception's arguments
    as stored) and ``text``.
    """

    def __init__(self, exc_type: str, message: str, traceback: str | None = None,
                 exc_args: tuple[Any, ...] = ()) -> None:
        super().__init__(exc_type, message, traceback)
        self.exc_type = exc_type
        self.message = message
        self.traceback = traceback
        self.exc_args = tuple(exc_args)

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.exc_type, self.message, self.traceback, self.exc_args)

    def __str__(self) -> str:
        return f"{self.exc_type}: {self.message}"

    @property
    def exc_module(self) -> str:
        """The module of the remote exception's class (``builtins`` for a builtin)."""
        return self.exc_type.rpartition(".")[0] or "builtins"

    @property
    def exc_cls_name(self) -> str:
        """The remote exception's class name, without its module."""
        return self.exc_type.rpartition(".")[2]

    @property
    def text(self) -> str:
        """The remote exception's message (Celery's ``UnpickleableExceptionWrapper.text``)."""
        return self.message


class TaskRevoked(TaskError):
    """The task was revoked or expired before it ran."""


class WorkerLostError(TaskError):
    """The process running the task exited or was killed before it finished."""


class TimeLimitExceeded(TaskError):
    """The task ran past its hard time limit and was killed."""


class SoftTimeLimitExceeded(TaskError):
    """Raised inside a task when it reaches its soft time limit; the task may clean up."""

    def __init__(self, *args: object) -> None:
        # The threads pool raises the class in a thread (PyThreadState_SetAsyncExc takes
        # no arguments): it still says what happened.
        super().__init__(*(args or ("soft time limit exceeded",)))


class MaxRetriesExceededError(TaskError):
    """``Task.retry()`` was called after ``max_retries`` retries."""


class ControlError(CeleriacError):
    """A remote-control command is malformed (unknown, bad arguments) or refused (not
    signed, read-only mode); a worker answers it with ``{"error": message}``."""


class ResultTimeout(CeleriacError, TimeoutError):
    """``AsyncResult.get()`` waited longer than its timeout."""


class IncompleteStream(CeleriacError):
    """``AsyncResult.collect()`` reached a result that is not ready yet (Celery's name);
    ``collect(intermediate=True)`` yields what is ready instead."""


class TaskControl(CeleriacError):
    """Control flow raised from inside a task; not a failure."""


class Retry(TaskControl):
    """Raised by ``Task.retry()``: the task is published again to run later."""

    def __init__(
        self,
        message: str | None = None,
        exc: BaseException | None = None,
        when: float | datetime | None = None,
    ) -> None:
        super().__init__(message, exc, when)
        self.message = message
        self.exc = exc
        self.when = when

    def __str__(self) -> str:
        reason = self.message or (repr(self.exc) if self.exc else "retry requested")
        return f"Retry in {self.when}s: {reason}" if self.when is not None else f"Retry: {reason}"


class Reject(TaskControl):
    """Refuse the message: dead-lettered, or put back on its queue if ``requeue``."""

    def __init__(self, reason: Any = None, requeue: bool = False) -> None:
        super().__init__(reason, requeue)
        self.reason = reason
        self.requeue = requeue


class Ignore(TaskControl):
    """Finish without storing a state; the message is acknowledged."""


class WorkerShutdown(BaseException):
    """Ask the worker to stop after running tasks finish (warm shutdown)."""


class WorkerTerminate(WorkerShutdown):
    """Ask the worker to stop at once (cold shutdown); running tasks are redelivered."""


class ChordError(TaskError):
    """A header task of a chord failed (or its result is gone): the body was not run.
    The message names the task."""
