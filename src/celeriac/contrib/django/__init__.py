"""Django, as Celery's Django integration has it (``pip install 'celeriac[django]'``).

- The Celery docs' layout works as it is: ``proj/celery.py`` with
  ``app.config_from_object("django.conf:settings", namespace="CELERY")`` and
  ``app.autodiscover_tasks()``. When ``DJANGO_SETTINGS_MODULE`` is set, the app calls
  ``fixup`` (``celeriac/fixups/django.py``, Celery's ``celery.fixups.django``) as it is
  finalized, before it imports any task module (which may import models):
  ``django.setup()``, then ``DjangoFixup``'s hooks.
- ``task.delay_on_commit()`` / ``apply_async_on_commit()`` on every task
  (``celeriac/tasks/django_commit.py``); ``DjangoTask`` at Celery's path
  (``celeriac.contrib.django.task``).
- ``result_backend="django-db"``: django-celery-results' tables
  (``celeriac/backends/django_db.py``).
- ``beat_scheduler="django_celery_beat.schedulers:DatabaseScheduler"``:
  django-celery-beat's tables (``celeriac/beat/django.py``).

The guide: ``docs/guide/django.md``.
"""

from __future__ import annotations

from ...fixups.django import DjangoFixup, fixup

__all__ = ["DjangoFixup", "fixup"]
