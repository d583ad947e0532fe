"""The task app, in the layout of Celery's "First steps with Django" with ``celery``
changed to ``celeriac``: run ``celeriac -A proj worker -B -l info``."""

import os

from celeriac import Celeriac

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

app = Celeriac("proj")

# Every setting under CELERY_ in Django's settings (CELERY_BROKER_URL, ...).
app.config_from_object("django.conf:settings", namespace="CELERY")

# The tasks.py module of every installed Django app.
app.autodiscover_tasks()
