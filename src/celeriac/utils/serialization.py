"""Celery's ``celery.utils.serialization``: what a failed task's exception arrives as when
it is not re-created on the reading side.

``UnpickleableExceptionWrapper`` is ``celeriac.errors.TaskFailed`` (one class per
concept): ``AsyncResult.get()`` raises it for an exception whose type this process does
not re-create, with Celery's attributes ``exc_module``, ``exc_cls_name``, ``exc_args``
and ``text``. Celery's pickling helpers are not provided: celeriac stores exceptions as
``{"exc_type", "exc_module", "exc_message"}`` and never unpickles one.
"""

from __future__ import annotations

from typing import NoReturn

from ..errors import TaskFailed

UnpickleableExceptionWrapper = TaskFailed

_PICKLING = ("celeriac never pickles or unpickles exceptions (results store "
             "{exc_type, exc_module, exc_message}; a type it does not re-create arrives as "
             "UnpickleableExceptionWrapper, i.e. celeriac.errors.TaskFailed)")
_ABSENT = {name: _PICKLING for name in (
    "subclass_exception", "find_pickleable_exception", "create_exception_cls",
    "get_pickleable_exception", "get_pickleable_etype", "get_pickled_exception")}
_ABSENT["strtobool"] = ("a string helper of Celery's internals; celeriac's settings "
                        "convert Celery's string booleans themselves")


def __getattr__(name: str) -> NoReturn:
    reason = _ABSENT.get(name)
    if reason is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    raise ImportError(f"celeriac.utils.serialization.{name} is not provided: {reason}",
                      name=__name__)


__all__ = ["UnpickleableExceptionWrapper"]
