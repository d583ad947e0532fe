"""Canvas: signatures, chains, groups, map/starmap/chunks, with Celery's names and wire.

A signature is a dict with Celery's keys, so it travels in a message as JSON and is
rebuilt on the far side with ``signature(d, app=app)``::

    {"task": "proj.add", "args": [2], "kwargs": {}, "options": {"task_id": "..."},
     "subtask_type": null, "immutable": false, "chord_size": null}

A chain sends only its first task; the other steps ride in that message's body, in the
embed's ``chain``: last step first (the worker pops the next step off the end), each with
its task id assigned up front, ``parent_id`` the step before and ``root_id`` the
workflow's first task. A group sends its members in bulk round trips (1,000 messages
each), every message with the group's id in its ``group`` header and its place in
``group_index``. Chords are not available yet.

``signature.py``: ``Signature`` and sending one; ``workflows.py``: ``chain``, ``group``
(``chord``'s placeholder); ``celeriac/builtins.py``: map, starmap, chunks and the
``celery.map``/``celery.starmap`` tasks every app registers.

Import order: ``celeriac.builtins`` needs this package's modules, so it is imported from
here (never before this package: ``app.py`` imports ``register_builtins`` from here).
"""

from ..builtins import chunks, register_builtins, xmap, xstarmap
from ..result import GroupResult
from .signature import Signature, maybe_signature, signature
from .workflows import chain, chord, group

__all__ = ["GroupResult", "Signature", "chain", "chord", "chunks",
           "group", "maybe_signature", "register_builtins", "signature", "xmap", "xstarmap"]
