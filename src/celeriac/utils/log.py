"""Celery's ``celery.utils.log``: ``get_task_logger(__name__)`` and ``get_logger``.

A task logger is the standard library's logger of that name; while a task runs, its
records carry ``task_id`` and ``task_name`` (empty strings outside a task, and ``???``
when no task runs, as Celery's ``TaskFormatter`` writes them), so a format such as
``%(task_name)s[%(task_id)s]: %(message)s`` works in a handler of the user's own.
"""

from __future__ import annotations

import logging

from ..runtime.request import current_request

RESERVED_LOGGER_NAMES = frozenset({"celeriac", "celeriac.task"})
"""Names a task logger may not take: celeriac's own loggers."""

base_logger = logging.getLogger("celeriac")
task_logger = logging.getLogger("celeriac.task")


class TaskContextFilter(logging.Filter):
    """Adds the running task's ``task_id`` and ``task_name`` to each record (``???``
    outside a task); never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        request = current_request()
        if request is not None and request.id:
            record.task_id, record.task_name = request.id, request.task
        else:
            record.task_id = record.task_name = "???"
        return True


_FILTER = TaskContextFilter()


def get_logger(name: str) -> logging.Logger:
    """The logger ``name`` (``logging.getLogger``)."""
    return logging.getLogger(name)


def get_task_logger(name: str) -> logging.Logger:
    """The logger ``name`` for a task module, its records marked with the running task's
    id and name; celeriac's own names are refused with ``RuntimeError``, as Celery refuses
    its own."""
    if name in RESERVED_LOGGER_NAMES:
        raise RuntimeError(f"Logger name {name!r} is reserved!")
    logger = logging.getLogger(name)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    return logger


__all__ = ["RESERVED_LOGGER_NAMES", "TaskContextFilter", "base_logger", "get_logger",
           "get_task_logger", "task_logger"]
