"""Periodic tasks: ``celeriac beat``, any number of them, sending each due time once.

- ``entries``: ``BeatEntry`` and Celery's ``beat_schedule`` dict form;
- what beats share (the beat lease, run-key claims, entries) lives in the
  deployment's shared store, ``celeriac.stores``;
- ``service``: ``Beat``, the scheduler's tick; ``runner``: it on a Timer;
  ``step``: ``worker -B``; ``api``: ``app.beat``;
- ``schedules`` and ``solar``: Celery's ``schedule``, ``crontab`` and ``solar``
  (``celeriac.schedules`` is their public path).

Nothing is imported here: a configuration module's ``from celeriac.schedules import
crontab`` loads the schedules, not the scheduler (which stands on the worker's Timer).
"""
