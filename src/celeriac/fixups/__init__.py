"""Fixups: what a framework needs done as an app is finalized (Celery's
``celery.fixups``). One today: Django's (``fixups/django.py``)."""
