"""Celery's ``celery.contrib.django.task.DjangoTask`` at its path: every celeriac task
already has ``delay_on_commit`` and ``apply_async_on_commit``
(``celeriac/tasks/django_commit.py``), so it is the plain ``Task``; code that names it
(``Celery("proj", task_cls="celery.contrib.django.task:DjangoTask")``, ``base=DjangoTask``)
ports by the rename alone."""

from __future__ import annotations

from ...tasks import Task

DjangoTask = Task

__all__ = ["DjangoTask"]
