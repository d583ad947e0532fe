"""Celery's Django fixup at its path (``celery.fixups.django``): when
``DJANGO_SETTINGS_MODULE`` is set, ``Celeriac.finalize`` calls ``fixup`` before it imports
any task module (which may import models): ``django.setup()``, then ``DjangoFixup``'s
hooks. Django is imported only here, when the variable is set.
"""

from __future__ import annotations

import logging
import os
import weakref
from typing import TYPE_CHECKING, Any

from ..hooks import Hooks

if TYPE_CHECKING:
    from ..app import Celeriac
    from ..tasks import Request

logger = logging.getLogger("celeriac.fixups.django")

_INHERITED: list[Any] = []
"""Database connections a pool child inherited from its parent: kept referenced, never
closed nor collected here (either would end the parent's session on the server)."""


class DjangoFixup(Hooks):
    """What Celery's Django fixup does where tasks run: a pool child drops the database
    connections its parent had open, and each task starts and ends with Django's
    ``close_old_connections()`` (a connection past ``CONN_MAX_AGE``, or broken by a
    database restart, is replaced rather than failing every later task)."""

    def worker_process_init(self) -> None:
        from django.db import connections

        for conn in connections.all(initialized_only=True):
            if conn.connection is not None:
                _INHERITED.append(conn.connection)
                conn.connection = None

    def before_task(self, request: Request) -> None:
        if not request.is_eager:
            _close_old_connections(request)

    def after_task(self, request: Request, state: str, retval: Any) -> None:
        if not request.is_eager:
            _close_old_connections(request)


def _close_old_connections(request: Request) -> None:
    from django.core.exceptions import SynchronousOnlyOperation
    from django.db import close_old_connections

    try:
        close_old_connections()
    except SynchronousOnlyOperation:
        # An async task's hooks run on its event loop: Django's connections are not
        # used there (Django's async ORM runs them in its own threads).
        logger.debug("task %s: database connections left as they are on the event loop",
                     request.id)


def fixup(app: Celeriac) -> DjangoFixup | None:
    """Set Django up for ``app`` (called by ``Celeriac.finalize`` when
    ``DJANGO_SETTINGS_MODULE`` is set): ``django.setup()`` unless Django is already set
    up or setting up (a Django process imports the app while it loads its apps), and
    ``DjangoFixup`` added to the app's hooks, once. None when Django is not installed."""
    if not os.environ.get("DJANGO_SETTINGS_MODULE"):
        return None
    try:
        import django
        from django.apps import apps
    except ImportError:
        logger.warning("DJANGO_SETTINGS_MODULE is set but Django is not installed: "
                       "pip install 'celeriac[django]'")
        return None
    if not apps.ready and not apps.loading:
        django.setup()
    hooks = _FIXED.get(app)
    if hooks is None:
        hooks = _FIXED[app] = DjangoFixup()
        app.add_hooks(hooks)
    return hooks


_FIXED: weakref.WeakKeyDictionary[Celeriac, DjangoFixup] = weakref.WeakKeyDictionary()


__all__ = ["DjangoFixup", "fixup"]
