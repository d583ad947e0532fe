"""The sending side: everything between ``task.delay()`` and the broker's publish.

::

    Task.apply_async / delay          Celeriac.send_task / send_many     canvas, followups
            \\                                  |                           /
             `---- SendOptions (options.py): made once per call, checked ------'
                  (a worker's follow-up: as the signature holds them, unchecked)
                                               |
            build / prepare (builder.py): lineage, the body [args, kwargs, embed] encoded
            once (messages.py), compression, v2 headers, properties, the queue
                                               |
            send / send_many / publish_prepared (publish.py): hooks, the publish's retry
            policy, ``publisher.publish``/``publish_many``, the ``task-sent`` event

- ``options.py``: ``SendOptions`` (frozen; Celery's ``apply_async`` names, ``link`` and
  ``link_error`` as the ``embed``), ``SEND_OPTIONS`` (``apply_async``'s extra names),
  ``EMPTY_EMBED``. Imports nothing of celeriac's: ``tasks.py`` imports it.
- ``messages.py``: ``split_call`` (a bulk call's arguments), ``validate_priority``,
  ``absolute_time`` (``expires``), ``encode_body`` (an ``EncodeError`` naming the
  argument that cannot be encoded).
- ``builder.py``: ``build`` (message, queue, delay: every send's hot path) and ``prepare``
  (an ``Outgoing``, the send recorded among the running task's children); ``lenient``
  is a worker's follow-up's policy (a compression it cannot apply: logged, sent
  uncompressed).
- ``publish.py``: ``send``, ``send_many``, ``publish_prepared``, ``publish_chunk``,
  ``sent_event``.

``Celeriac.send_task``/``send_many``/``publish_prepared`` and ``Task.apply_async``
keep Celery's signatures and delegate here; ``canvas/`` and ``worker/followups.py``
build through ``prepare``/``build`` too.
"""

from .builder import build, prepare
from .messages import absolute_time, encode_body, split_call, validate_priority
from .options import DEFAULT, EMPTY_EMBED, SEND_OPTIONS, SendOptions
from .publish import publish_chunk, publish_prepared, send, send_many, sent_event

__all__ = ["DEFAULT", "EMPTY_EMBED", "SEND_OPTIONS", "SendOptions", "absolute_time", "build",
           "encode_body", "prepare", "publish_chunk", "publish_prepared", "send", "send_many",
           "sent_event", "split_call", "validate_priority"]
