"""What both sides of the AMQP transport share: names, arguments, the wire form of a
``Message``, delivery counts, delay routing and broker URLs. No I/O here.

The worker (``transport.py``, ``link.py``, on aiormq) and the producers
(``client.py``, on pika) must agree on every name and argument below, or RabbitMQ
refuses the second declaration of a queue (PRECONDITION_FAILED).
"""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from ...clients.net import mask_password
from ...errors import ConfigurationError, EncodeError
from ...protocol import Message
from ..base import PRIVATE_PREFIX, DeadLetter

if TYPE_CHECKING:
    from ...settings import Settings

DELIVERIES = "x-celeriac-deliveries"
"""Deliveries already counted when this copy was published (absent: none)."""
DEAD_REASON = "x-celeriac-reason"
DEAD_QUEUE = "x-celeriac-queue"
DEAD_AT = "x-celeriac-dead-at"
DEAD_ID = "x-celeriac-dead-id"
DEAD_HEADERS = (DEAD_REASON, DEAD_QUEUE, DEAD_AT, DEAD_ID, DELIVERIES)
QUORUM_COUNT = "x-delivery-count"
# Annotations the broker adds (dead-lettering through the delay queues, quorum returns):
# not part of the message that was published.
_BROKER_HEADERS = ("x-death", "x-first-death-exchange", "x-first-death-queue",
                   "x-first-death-reason", "x-last-death-exchange", "x-last-death-queue",
                   "x-last-death-reason", QUORUM_COUNT)

MAX_PRIORITY = 10
"""x-max-priority of classic queues; celeriac uses 0-9 (higher first)."""
DELAY_LEVELS = 31
"""Delay queue ``k`` holds a message 2**k ms: delays up to 2**31 - 1 ms (24.8 days)."""
MAX_DELAY_MS = 2 ** DELAY_LEVELS - 1
DELAY_EXPIRES_MS = 2 ** 32 - 1
"""x-expires of delay queues (RabbitMQ's maximum, 49.7 days), beyond any stored delay."""
REDECLARE_DELAYS_AFTER = 86400.0
"""Seconds; a producer re-declares delay queues at least this often (x-expires resets)."""
CONSUMER_TIMEOUT_MS = 2 ** 31 - 1
"""x-consumer-timeout (RabbitMQ >= 3.11.15): a live worker's long task is never taken back."""


@dataclass(frozen=True, slots=True)
class Config:
    """The broker URLs and every name this transport declares."""

    urls: tuple[str, ...]
    """Connection URLs (``namespace`` removed), in failover order."""
    namespace: str
    quorum: bool
    shuffle: bool
    consumer_timeout: int
    heartbeat: int
    """Seconds; the worker connection's AMQP heartbeat, from worker_lease_timeout."""
    kombu: bool = False
    """``?layout=kombu``: task queues declared exactly as Celery 5 declares them (no
    ``x-max-priority`` unless ``max_priority`` is given, a direct exchange of the queue's
    name bound with the queue's name), so neither side's declaration is refused."""
    max_priority: int | None = None
    """``?max_priority=N`` with the kombu layout: Celery's ``task_queue_max_priority``."""

    @classmethod
    def from_settings(cls, url: str, settings: Settings) -> Config:
        listed = [u.strip() for u in settings.broker_url.split(";") if u.strip()]
        urls = listed if listed and listed[0] == url else [url]
        query = _query(url)
        namespace = query.get("namespace", "")
        kombu = query.get("layout") == "kombu"
        if kombu and namespace:
            raise ConfigurationError(
                "namespace: the kombu layout names queues as Celery does; a namespace "
                "would hide them from Celery (use a virtual host of its own instead)")
        raw_priority = query.get("max_priority")
        try:
            max_priority = None if raw_priority is None else int(raw_priority)
        except ValueError:
            max_priority = -1
        if max_priority is not None and not (kombu and 1 <= max_priority <= 255):
            raise ConfigurationError(
                f"max_priority={raw_priority!r}: an integer from 1 to 255, with "
                "layout=kombu (Celery's task_queue_max_priority)")
        opts: Mapping[str, Any] = settings.broker_transport_options
        queue_type = str(opts.get("queue_type", "classic"))
        if queue_type not in ("classic", "quorum"):
            raise ConfigurationError(
                f"broker_transport_options queue_type must be 'classic' or 'quorum', "
                f"got {queue_type!r}")
        # RabbitMQ drops a connection after two missed heartbeats: a worker that stops
        # answering loses its messages after about worker_lease_timeout, as on SQLite.
        heartbeat = int(opts.get("heartbeat", max(1, round(settings.worker_lease_timeout / 2))))
        return cls(
            urls=tuple(_without_namespace(u) for u in urls),
            namespace=namespace,
            quorum=queue_type == "quorum",
            shuffle=settings.broker_failover_strategy == "shuffle",
            consumer_timeout=int(opts.get("consumer_timeout", CONSUMER_TIMEOUT_MS)),
            heartbeat=heartbeat,
            kombu=kombu,
            max_priority=max_priority,
        )

    def ordered(self, start: int = 0) -> list[str]:
        """URLs to try, in failover order."""
        if self.shuffle:
            return random.sample(self.urls, len(self.urls))
        return [self.urls[(start + i) % len(self.urls)] for i in range(len(self.urls))]

    # -- names ------------------------------------------------------------------------
    def queue(self, name: str) -> str:
        return self.namespace + name

    @property
    def dead(self) -> str:
        return self.namespace + "celeriac.dead"

    def fanout(self, channel: str) -> str:
        return self.namespace + channel

    def broadcast_route(self, channel: str) -> tuple[str, str, str | None]:
        """(exchange, its type, the routing key that reaches only ``channel``'s
        subscribers or None: every binding) of a broadcast channel. A private channel
        (``transports.base.PRIVATE_PREFIX``, a remote-control reply) is a routing key of
        one direct exchange, so a call declares no exchange of its own that would
        outlive it."""
        if channel.startswith(PRIVATE_PREFIX):
            return self.namespace + PRIVATE_PREFIX[:-1], "direct", channel[len(PRIVATE_PREFIX):]
        return self.namespace + channel, "fanout", None

    def delay(self, queue: str, level: int) -> str:
        """Delay queue ``level`` of ``queue``, and the topic exchange in front of it."""
        return f"{self.namespace}celeriac.delay.{queue}.{level}"

    # -- arguments ----------------------------------------------------------------------
    def queue_arguments(self) -> dict[str, Any]:
        if self.quorum:
            return {"x-queue-type": "quorum"}
        if self.kombu:  # Celery's defaults: no priorities unless task_queue_max_priority
            return {} if self.max_priority is None else {"x-max-priority": self.max_priority}
        return {"x-max-priority": MAX_PRIORITY}

    def dead_arguments(self) -> dict[str, Any]:
        return {"x-queue-type": "quorum"} if self.quorum else {}

    def delay_arguments(self, queue: str, level: int) -> dict[str, Any]:
        args: dict[str, Any] = {"x-message-ttl": 2 ** level, "x-expires": DELAY_EXPIRES_MS}
        if level == 0:
            args["x-dead-letter-exchange"] = ""
            args["x-dead-letter-routing-key"] = self.queue(queue)
        else:
            # No dead-letter routing key: the message keeps its bit routing key.
            args["x-dead-letter-exchange"] = self.delay(queue, level - 1)
        if self.quorum:
            # Quorum dead-lettering is at-most-once unless asked (RabbitMQ >= 3.10).
            args.update({"x-queue-type": "quorum", "x-dead-letter-strategy": "at-least-once",
                         "x-overflow": "reject-publish"})
        return args


# -- delays -------------------------------------------------------------------------------
def delay_route(delay: float) -> tuple[int, str] | None:
    """(highest level, routing key) for a delay in seconds; None when it is under 1 ms.

    The routing key spells the delay in milliseconds as DELAY_LEVELS binary words, most
    significant first: "0.0.....1.0.0.1.0.1.1.0.0". Longer delays are capped (the worker
    parks a message whose ``eta`` header is still ahead again).
    """
    ms = min(math.ceil(delay * 1000), MAX_DELAY_MS)
    if ms <= 0:
        return None
    bits = ".".join("1" if ms >> k & 1 else "0" for k in reversed(range(DELAY_LEVELS)))
    return ms.bit_length() - 1, bits


def bit_pattern(level: int, bit: str) -> str:
    """The topic pattern that matches routing keys with ``bit`` at ``level``."""
    return ".".join(["*"] * (DELAY_LEVELS - 1 - level) + [bit, "#"])


# -- messages on the wire -----------------------------------------------------------------
def wire_properties(message: Message) -> dict[str, Any]:
    """AMQP basic properties for ``encode_properties``: headers go into the AMQP headers
    table and properties into AMQP properties, as in Celery's protocol v2."""
    props: dict[str, Any] = {
        "headers": message.headers,
        "content_type": message.content_type,
        "content_encoding": message.content_encoding,
        "delivery_mode": 2,  # persistent, whatever was asked: we never lose a task
        "priority": message.priority,
    }
    for name in ("correlation_id", "reply_to", "app_id"):
        if message.properties.get(name) is not None:
            props[name] = str(message.properties[name])
    return props


@dataclass(frozen=True, slots=True)
class Incoming:
    message: Message
    counted: int
    """Deliveries counted before this copy was published (our header)."""
    returns: int | None
    """Quorum queues: how often the broker took it back from a consumer."""

    def delivery_count(self, redelivered: bool) -> int:
        if self.returns is not None:
            return self.counted + 1 + self.returns
        return self.counted + 1 + (1 if redelivered else 0)


def from_wire(props: Any, body: bytes, keep: frozenset[str] = frozenset()) -> Incoming:
    """The ``Message`` as it was published, and what the broker says about its history.
    ``props`` is pamqp's ``Basic.Properties`` (pika's ``BasicProperties`` has the same
    names, but its decoder truncates floats).

    Properties come back in the shape ``protocol.task_properties`` builds (and Celery
    sends): ``priority`` always; ``correlation_id``, ``reply_to`` and ``delivery_mode``
    when the message has a correlation id, as every task message does.
    """
    raw = props.headers or {}
    returns = raw.get(QUORUM_COUNT)
    counted = raw.get(DELIVERIES, 0)
    # A copy: what the consumer does to its Message must not reach what we may publish
    # again (requeue, dead letter) from ``props``.
    headers = {k: _copy(v) for k, v in raw.items() if k not in _OURS or k in keep}
    properties: dict[str, Any] = {"priority": int(props.priority or 0)}
    if props.correlation_id is not None:
        properties = {"correlation_id": props.correlation_id, "reply_to": props.reply_to,
                      "delivery_mode": props.delivery_mode, **properties}
    app_id = getattr(props, "app_id", None)
    if app_id is not None:  # apply_async(app_id=): the task's request.properties
        properties["app_id"] = app_id
    message = Message(headers, bytes(body), props.content_type or "application/data",
                      props.content_encoding or "binary", properties)
    return Incoming(message, counted if isinstance(counted, int) else 0,
                    int(returns) if isinstance(returns, int) else None)


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


_OURS = frozenset((*_BROKER_HEADERS, *DEAD_HEADERS))
_KEPT_PROPERTIES = ("content_type", "content_encoding", "priority", "correlation_id",
                    "reply_to", "message_id", "timestamp", "message_type", "app_id")


def republished(props: Any, counted: int, extra: Mapping[str, Any] | None = None
                ) -> dict[str, Any]:
    """pamqp properties for a copy of a delivered message: the headers as published,
    its delivery count, ``extra`` (dead-letter annotations)."""
    headers = {k: v for k, v in (props.headers or {}).items() if k not in _OURS}
    if counted > 0:
        headers[DELIVERIES] = counted
    headers.update(extra or {})
    kept = {n: getattr(props, n, None) for n in _KEPT_PROPERTIES}
    return {**{n: v for n, v in kept.items() if v is not None}, "headers": headers,
            "delivery_mode": 2}


# AMQP 0-9-1 basic properties: name, flag bit, type (s: shortstr, o: octet, F: table,
# T: timestamp), in wire order.
_PROPERTIES = (("content_type", 15, "s"), ("content_encoding", 14, "s"), ("headers", 13, "F"),
               ("delivery_mode", 12, "o"), ("priority", 11, "o"), ("correlation_id", 10, "s"),
               ("reply_to", 9, "s"), ("expiration", 8, "s"), ("message_id", 7, "s"),
               ("timestamp", 6, "T"), ("message_type", 5, "s"), ("user_id", 4, "s"),
               ("app_id", 3, "s"))


def encode_properties(props: Mapping[str, Any]) -> bytes:
    """The property list of a content header, headers table encoded as py-amqp (Celery's
    client) does: str 'S', int 'I' (64-bit 'l'), float 'd', None 'V'. pika has no float
    in tables and pamqp writes floats as 32-bit 'f': both would change the headers."""
    flags, parts = 0, []
    try:
        for name, bit, kind in _PROPERTIES:
            value = props.get(name)
            if value is None:
                continue
            flags |= 1 << bit
            if kind == "s":
                parts.append(_shortstr(str(value)))
            elif kind == "o":
                parts.append(struct.pack(">B", value))
            elif kind == "F":
                parts.append(_table(value))
            else:
                parts.append(struct.pack(">Q", _seconds(value)))
    except (TypeError, ValueError, OverflowError, struct.error) as exc:
        raise EncodeError(f"message {name} cannot be sent over AMQP: {exc}") from exc
    return struct.pack(">H", flags) + b"".join(parts)


def _utf8(text: str) -> bytes:
    # surrogateescape first: lone surrogates from tolerant.py's decoding become the
    # bytes they came from, so a dead letter is the message as it was published.
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def _shortstr(text: str) -> bytes:
    raw = _utf8(text)
    if len(raw) > 255:
        raise ValueError(f"{text[:40]!r}... is longer than 255 bytes")
    return struct.pack(">B", len(raw)) + raw


def _table(table: Mapping[str, Any]) -> bytes:
    body = b"".join(_shortstr(str(k)) + _value(v) for k, v in table.items())
    return struct.pack(">I", len(body)) + body


def _value(v: Any) -> bytes:
    if isinstance(v, str):
        raw = _utf8(v)
        return b"S" + struct.pack(">I", len(raw)) + raw
    if isinstance(v, bool):
        return b"t" + struct.pack(">B", v)
    if isinstance(v, int):
        return b"I" + struct.pack(">i", v) if -2**31 <= v < 2**31 else b"l" + struct.pack(">q", v)
    if isinstance(v, float):
        return b"d" + struct.pack(">d", v)
    if v is None:
        return b"V"
    if isinstance(v, Mapping):
        return b"F" + _table(v)
    if isinstance(v, (list, tuple)):
        body = b"".join(_value(item) for item in v)
        return b"A" + struct.pack(">I", len(body)) + body
    if isinstance(v, (bytes, bytearray)):
        return b"x" + struct.pack(">I", len(v)) + bytes(v)
    if isinstance(v, Decimal):
        sign, digits, exponent = v.as_tuple()
        unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
        return b"D" + struct.pack(">Bi", -int(exponent), unscaled)
    if isinstance(v, datetime):
        return b"T" + struct.pack(">Q", _seconds(v))
    raise TypeError(f"{type(v).__name__} is not an AMQP field type")


def _seconds(value: Any) -> int:
    return int(value.timestamp()) if isinstance(value, datetime) else int(value)


# -- URLs ---------------------------------------------------------------------------------
def _query(url: str) -> dict[str, str]:
    return dict(parse_qsl(urlsplit(url).query))


_URL_OPTIONS = ("namespace", "layout", "max_priority")
"""Our URL parameters, taken out before a URL reaches the AMQP clients."""


def _without_namespace(url: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in _URL_OPTIONS]
    return urlunsplit(parts._replace(query=urlencode(query)))


def vhost(url: str) -> str:
    """The virtual host, as kombu reads it: ``amqp://host//`` and ``amqp://host/`` are "/"."""
    path = urlsplit(url).path
    return "/" if path in ("", "/") else unquote(path[1:])


def dead_letter(props: Any, body: bytes) -> DeadLetter:
    incoming = from_wire(props, body, keep=frozenset(DEAD_HEADERS[:-1]))
    m = incoming.message
    headers = dict(m.headers)
    dead_id = str(headers.pop(DEAD_ID, "") or "")
    queue, reason = str(headers.pop(DEAD_QUEUE, "")), str(headers.pop(DEAD_REASON, ""))
    dead_at = headers.pop(DEAD_AT, 0.0)
    message = Message(headers, m.body, m.content_type, m.content_encoding, m.properties)
    return DeadLetter(dead_id, queue, reason, message, incoming.counted,
                      float(dead_at) if isinstance(dead_at, (int, float)) else 0.0)


masked = mask_password
"""``url`` with its password masked, for messages and logs."""


def describe(exc: BaseException) -> str:
    text = str(exc) or repr(exc)
    return f"{type(exc).__name__}: {text}"
