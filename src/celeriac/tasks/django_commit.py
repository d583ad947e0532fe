"""``Task.delay_on_commit`` and ``Task.apply_async_on_commit``: Celery 5.4's ``DjangoTask``
methods, on every task.

The send is handed to Django's ``transaction.on_commit``: inside an ``atomic()`` block it
happens after the outermost block commits, and never if it rolls back (so a worker never
looks for a row that is not there yet); outside one, at once. Like Celery's, they return
None: the message does not exist yet, so there is no result handle to give (pass
``task_id=`` to ``apply_async_on_commit`` to know the id beforehand).

Django is imported when one of them is called, never before: a task module that does not
use them needs no Django. Note the gap Celery leaves too: a process that dies between the
commit and the send loses the task.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError
from ..producer.options import SEND_OPTIONS

if TYPE_CHECKING:
    from . import Task


def _on_commit() -> Any:
    try:  # deferred: Django is optional
        from django.db import transaction
    except ImportError as exc:
        raise ConfigurationError("delay_on_commit() and apply_async_on_commit() need "
                                 "Django: pip install 'celeriac[django]'") from exc
    return transaction.on_commit


def delay_on_commit(self: Task[Any, Any], *args: Any, **kwargs: Any) -> None:
    """``self.delay(*args, **kwargs)`` once the current transaction of Django's default
    database commits (at once outside one; never if it rolls back). Returns None."""
    _on_commit()(functools.partial(self.delay, *args, **kwargs))


def apply_async_on_commit(self: Task[Any, Any], args: Sequence[Any] | None = None,
                          kwargs: Mapping[str, Any] | None = None, *,
                          using: str | None = None, **options: Any) -> None:
    """``self.apply_async(args, kwargs, **options)`` once the current transaction of
    database ``using`` (None: Django's default) commits. Returns None."""
    if using is not None and (not isinstance(using, str) or not using):
        raise ValueError(f"using must be a database alias (a non-empty string), "
                         f"got {using!r}")
    # Checked now, not at commit: an error raised by on_commit's callback would surface in
    # the code that commits, after the rows it was about are written.
    named = inspect.signature(self.apply_async).parameters
    unknown = options.keys() - SEND_OPTIONS - named.keys()
    if unknown:
        raise TypeError(f"{self.name}.apply_async_on_commit() got unknown option(s): "
                        f"{', '.join(sorted(unknown))}")
    send = functools.partial(self.apply_async, args, kwargs, **options)
    if using is None:
        _on_commit()(send)
    else:
        _on_commit()(send, using=using)
