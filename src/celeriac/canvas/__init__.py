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
``group_index``. A chord is a group whose members count themselves done in the result backend; the
count that completes it sends the body.

``signature.py``: ``Signature``, sending one and stamping (``StampingVisitor``: stamps
are options, sent as Celery's ``stamped_headers``/``stamps`` headers); ``workflows.py``:
``chain``, ``group``, ``chord`` and how they nest; ``builtins.py``: map, starmap, chunks
and the ``celery.map``, ``celery.starmap``, ``celery.chord_unlock``, ``celery.chord``
and ``celery.accumulate`` tasks every app registers;
``followups.py``: what a worker sends after a task ran (the rest of a chain, callbacks,
errbacks, a chord's count and body).

The canvas sits below the task class (``celeriac.tasks`` imports it for ``Task.s`` and
``Task.map``) and knows a task by what it has, never by its class.
"""

from ..result import GroupResult
from .builtins import chunks, register_builtins, xmap, xstarmap
from .signature import Signature, StampingVisitor, maybe_signature, signature
from .workflows import chain, chord, group

__all__ = ["GroupResult", "Signature", "StampingVisitor", "chain", "chord", "chunks",
           "group", "maybe_signature", "register_builtins", "signature", "xmap", "xstarmap"]
