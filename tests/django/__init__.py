"""The Django integration's tests (``celeriac.contrib.django``, ``django-db``, beat from
django-celery-beat's tables) and the in-process Django configuration they share."""
