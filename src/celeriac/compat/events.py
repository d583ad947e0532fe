"""Celery's events on a compatibility-layout broker (``?layout=kombu``): where they go,
and how the dispatcher's batches become what Celery's ``EventReceiver`` (``celery
events``, Flower) reads.

Celery's event dispatcher publishes through the ``celeryev`` exchange: on RabbitMQ a
durable topic exchange, each receiver binding a queue of its own with ``#``; on Redis
kombu's fanout emulation, a PUBLISH on ``/<db>.celeryev/<routing key>`` of kombu's JSON
envelope (body in base64), which each receiver PSUBSCRIBEs as ``/<db>.celeryev/*``
(kombu's ``fanout_prefix`` and ``fanout_patterns``, both on by default since kombu 4).
The routing key is the event's type with dots (``worker.heartbeat``, ``task.succeeded``);
a buffered batch (Celery 4+) is a JSON array sent as ``<group>.multi``. Celery's
receivers take both forms.

The dispatcher's events already carry Celery's fields (``hostname``, ``timestamp``,
``utcoffset``, ``pid``, ``clock``; ``freq``, ``sw_ident``, ``sw_ver``, ``sw_sys``,
``active``, ``processed``, ``loadavg`` for worker events; ``uuid``, ``name``, ``args``,
``kwargs``, ``retries``, ``eta``, ``expires``, ``root_id``, ``parent_id``, ``result``,
``runtime``, ``exception``, ``traceback``, ``terminated``, ``expired`` for task events),
and its batches hold one group each, sent as ``<group>.multi`` when they hold more than
one event. So only the framing changes here: a batch of one event goes as that event's
JSON object under its own routing key (the bytes between the array's brackets: no
decoding), a larger one as the array. Events Celery has no name for (our
``task-progress``) go too: Celery's state keeps the fields of task events it does not
know, as it does for custom events.

Our own receivers on this layout read the same exchange, so ``celeriac events`` and
the dashboard show Celery's workers and tasks too: ``incoming`` makes a single event
on the wire a one-event array, the form ``EventReceiver`` decodes.
"""

from __future__ import annotations

import logging

from .kombu_wire import Exchange

logger = logging.getLogger("celeriac.events.celery_wire")

EXCHANGE = Exchange("celeryev", "topic", durable=True)
"""Celery's ``event_exchange``, declared as kombu's ``Exchange("celeryev", type="topic")``
(on Redis kombu treats it as a fanout, and nothing is declared)."""
BINDING = "#"
"""What a receiver binds with: every event (Celery's ``EventReceiver`` default)."""
MULTI = ".multi"


def outgoing(payload: bytes, key: str) -> bytes:
    """The body Celery's receivers read for a dispatcher ``payload`` (a JSON array of
    events) sent with routing key ``key``: the array itself for ``<group>.multi``, else
    the one event it holds, as an object."""
    if key.endswith(MULTI) or not (payload.startswith(b"[{") and payload.endswith(b"}]")):
        return payload
    return payload[1:-1]


def incoming(body: bytes) -> bytes:
    """A body from ``celeryev`` (an event object, or a Celery 4+ array of them) as the
    JSON array our ``EventReceiver`` decodes; anything else passes through, and the
    receiver counts it as malformed."""
    if body.lstrip()[:1] == b"{":
        return b"[" + body + b"]"
    return body
