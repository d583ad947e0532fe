"""The example Django project. Importing it loads the task app, as Celery's docs ask, so
that ``@shared_task`` tasks use it."""

from .celery import app as celery_app

__all__ = ("celery_app",)
