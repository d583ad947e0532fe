"""Periodic tasks: ``celeriac beat``, any number of them, sending each due time once.

- ``entries``: ``BeatEntry`` and Celery's ``beat_schedule`` dict form;
- ``store``: ``BeatStore``, beat's name for the deployment's shared store
  (``celeriac.stores``: the beat lease, run-key claims, entries; which store an app
  uses);
- ``service``: ``Beat``, the scheduler's tick; ``runner``: it on a Timer;
  ``step``: ``worker -B``; ``api``: ``app.beat``.
"""

from __future__ import annotations

from .api import BeatAPI
from .entries import BeatEntry, parse_entry
from .service import Beat
from .store import BeatStore, open_store

__all__ = ["Beat", "BeatAPI", "BeatEntry", "BeatStore", "open_store", "parse_entry"]
