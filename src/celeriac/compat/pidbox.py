"""Celery's remote-control mailbox (kombu's pidbox) on a compatibility-layout broker
(``?layout=kombu``): the names and headers that let ``celery inspect`` / ``celery
control`` and Flower reach celeriac workers, and ``app.control`` reach Celery's.

How kombu's ``Mailbox("celery", type="fanout")`` (Celery's ``app.control.mailbox``)
works, and what we do:

- A command is published through ``celery.pidbox``, a non-durable fanout exchange, with
  the headers ``clock`` and ``expires``. Its JSON body is the one ``mailbox.py``
  describes (``method``, ``arguments``, ``destination``, ``pattern``, ``matcher``,
  ``ticket``, ``reply_to``); Celery's workers take our extra fields (``timestamp``,
  ``signature``) as keyword arguments they ignore. Each Celery worker consumes a queue
  ``<hostname>.celery.pidbox`` bound to it; on Redis kombu emulates the fanout with
  PUBLISH on ``/<db>.celery.pidbox``, which the workers PSUBSCRIBE. A celeriac worker
  binds a queue of its own (RabbitMQ) or SUBSCRIBEs that channel (Redis).
- ``reply_to`` names ``reply.celery.pidbox`` (a non-durable direct exchange) and a
  routing key: kombu's caller binds its reply queue ``<key>.reply.celery.pidbox`` by it
  (the key is one per thread of the caller, its ``oid``; ours is one per call, the
  ticket). A worker answers ``{hostname: reply}`` through that exchange with the
  header ``ticket``, by which kombu's caller tells this call's replies from a late one
  of an earlier call. On Redis kombu routes a direct exchange through the binding set
  ``_kombu.binding.reply.celery.pidbox`` to the reply queue's list, which the caller
  BRPOPs; celeriac does the same lookup and LPUSH in one script.

The reply shapes are Celery's already (``inspect_commands.py``), so nothing else
changes: ``control/__init__.py`` and the worker's ``ControlStep`` use their transport's
broadcast channels, and a kombu-layout transport routes those channels here
(``channels.py``).
"""

from __future__ import annotations

import time
from typing import Any

from ..clients.schemes import layout
from ..transports.base import REPLY_EXCHANGE as CELERIAC_REPLY_EXCHANGE
from .kombu_wire import Exchange

NAMESPACE = "celery"
"""Celery's ``control_exchange`` default; other values are refused by our settings."""
EXCHANGE = Exchange(f"{NAMESPACE}.pidbox", "fanout", durable=False)
REPLY_EXCHANGE = Exchange(f"reply.{NAMESPACE}.pidbox", "direct", durable=False)
REPLY_EXPIRES_MS = 60_000
"""How long a reply list a caller no longer reads stays in Redis (kombu's caller gives
its reply queue ``x-expires`` = ``control_queue_expires``, 10 s, refreshed while it
listens; a reply pushed after the caller left would otherwise stay for good)."""
REPLY_BINDING_TTL_MS = 3_600_000
"""Our reply binding's deadline in ``_kombu.binding_deadlines`` (kombu 5.7's
``MIN_BINDING_TTL``): if the caller dies without removing it, kombu sweeps it then."""


def reply_exchange_for(broker_url: str) -> str:
    """The exchange a command's ``reply_to`` names on ``broker_url``: Celery's on the
    compatibility layout (a Celery worker declares and publishes to what it names),
    celeriac's otherwise."""
    first = broker_url.split(";")[0]
    return REPLY_EXCHANGE.name if layout(first) == "kombu" else CELERIAC_REPLY_EXCHANGE


def reply_queue(key: str) -> str:
    """kombu's name of the reply queue a caller binds with ``key``."""
    return f"{key}.{REPLY_EXCHANGE.name}"


def command_headers() -> dict[str, Any]:
    """kombu's command headers. The caller's clock means nothing to a worker (Celery's
    only moves its own clock forward on a command), and ``expires`` 0 is kombu's "none"
    (the caller stops listening after its timeout anyway)."""
    return {"clock": 0, "expires": 0}


def reply_headers(ticket: str) -> dict[str, Any]:
    """kombu's reply headers: the call's ``ticket``, and a clock (0: unknown here)."""
    return {"ticket": ticket, "clock": 0}


def now_ms() -> int:
    return int(time.time() * 1000)
