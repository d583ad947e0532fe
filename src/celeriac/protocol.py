"""Celery's task message protocol v2, and the compact envelope around it.

A task message is headers + properties + body. The headers carry everything a worker's
parent process needs to route, account and refuse a message (task name, id, eta, expires,
retries, time limits), so the parent never decodes the body: it hands the body bytes to
the process that runs the task. The body is ``[args, kwargs, embed]`` where ``embed`` holds
``callbacks``, ``errbacks``, ``chain`` and ``chord``.

On AMQP the headers and properties map onto AMQP's own. On SQLite and Redis the
envelope is ours: one JSON object ``{"h": headers, "p": properties, "ct": content_type,
"ce": content_encoding}`` stored beside the body bytes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from .errors import DecodeError
from .serialization import compression

REQUIRED_HEADERS = ("task", "id")
DECODE_ERROR_HEADER = "x-celeriac-decode-error"
"""Set by a transport on a message whose envelope it could not decode."""


@dataclass(frozen=True, slots=True)
class Message:
    """A message as the transports carry it. ``body`` is opaque bytes."""

    headers: dict[str, Any]
    body: bytes
    content_type: str = "application/json"
    content_encoding: str = "utf-8"
    properties: dict[str, Any] = field(default_factory=dict)
    kept: tuple[dict[str, Any], dict[str, Any]] | None = field(
        default=None, compare=False, repr=False)
    """``pack``'s compact headers and properties, where the producer made them
    (``built``): ``pack`` then compares nothing. Only a message no one has changed since
    it was built carries them (the builder leaves them out when hooks will see it)."""

    @classmethod
    def built(cls, headers: dict[str, Any], properties: dict[str, Any], body: bytes,
              content_type: str) -> Message:
        """A producer's message from ``kept_headers`` and ``kept_properties``: every
        header and property restored (as ``unpack`` does), and the compact parts kept
        for ``pack``."""
        task_id = headers["id"]
        return cls(_restore(headers, _HEADER_SPEC, task_id), body, content_type, "utf-8",
                   _restore(properties, _PROPERTY_SPEC, task_id), (headers, properties))

    @property
    def priority(self) -> int:
        return int(self.properties.get("priority") or 0)

    def envelope(self) -> bytes:
        """Everything but the body, as one JSON document."""
        return orjson.dumps(
            {"h": self.headers, "p": self.properties, "ct": self.content_type,
             "ce": self.content_encoding}
        )

    @classmethod
    def from_envelope(cls, envelope: bytes, body: bytes) -> Message:
        try:
            env = orjson.loads(envelope)
            return cls(env["h"], body, env["ct"], env.get("ce", "utf-8"), env.get("p") or {})
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise DecodeError(f"malformed message envelope: {exc}") from exc

    def with_headers(self, **changes: Any) -> Message:
        return Message({**self.headers, **changes}, self.body, self.content_type,
                       self.content_encoding, self.properties)

    def packed(self) -> tuple[bytes, bytes]:
        """``(envelope, body)`` in the compact form (``pack``)."""
        return pack(self)

    @classmethod
    def from_packed(cls, envelope: bytes, body: bytes) -> Message:
        """A message from ``packed()``'s parts, or from ``envelope()`` and the body."""
        return unpack(envelope, body)


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message handed to a consumer, until it is acked, rejected or dead-lettered."""

    message: Message
    queue: str
    tag: Any
    """Transport-specific handle for ack/reject."""
    delivery_count: int = 1
    """How many times the broker has handed this message out, this time included."""


def utcnow() -> datetime:
    return datetime.now(UTC)


_V4_CLEAR = 0xFFFFFFFFFFFF0FFF3FFFFFFFFFFFFFFF
_V4_SET = 0x00000000000040008000000000000000


def new_id() -> str:
    """A random (version 4) UUID's string, as ``str(uuid.uuid4())`` but without making
    a ``UUID``: a third of the cost, on every message sent."""
    h = ((int.from_bytes(os.urandom(16)) & _V4_CLEAR) | _V4_SET).to_bytes(16).hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_ORIGIN: str | None = None


def origin() -> str:
    global _ORIGIN
    if _ORIGIN is None:
        import socket  # deferred: the origin is made once, and socket is costly to import

        _ORIGIN = f"{os.getpid()}@{socket.gethostname()}"
    return _ORIGIN


def task_headers(*, task_id: str, **fields: Any) -> dict[str, Any]:
    """The headers of a task message (protocol v2, every one present), from
    ``kept_headers``' arguments; ``extra`` (the lineage, the group, the call's own
    headers) over the rest."""
    return _restore(kept_headers(task_id=task_id, **fields), _HEADER_SPEC, task_id)


def kept_headers(
    *,
    task: str,
    task_id: str,
    args_repr: str,
    kwargs_repr: str,
    eta: datetime | None = None,
    expires: datetime | None = None,
    retries: int = 0,
    time_limit: float | None = None,
    soft_time_limit: float | None = None,
    ignore_result: bool = False,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``task_headers``' values that differ from the defaults (``pack``'s compact form),
    made from the arguments: a producer builds these, not the whole set, and compares
    nothing (``Message.built``)."""
    kept: dict[str, Any] = {"task": task, "id": task_id, "origin": origin()}
    if args_repr != "()":
        kept["argsrepr"] = args_repr
    if kwargs_repr != "{}":
        kept["kwargsrepr"] = kwargs_repr
    if eta:
        kept["eta"] = eta.isoformat()
    if expires:
        kept["expires"] = expires.isoformat()
    if type(retries) is not int or retries:  # a retries of False is kept (pack's rule)
        kept["retries"] = retries
    if time_limit is not None or soft_time_limit is not None:
        kept["timelimit"] = [time_limit, soft_time_limit]
    if ignore_result is not False:
        kept["ignore_result"] = ignore_result
    if extra:
        for k, v in extra.items():
            if _differs(v, _HEADER_DEFAULTS.get(k, _NO_DEFAULT), task_id):
                kept[k] = v
            else:
                kept.pop(k, None)
    return kept


def task_properties(task_id: str, priority: int, reply_to: str | None = None) -> dict[str, Any]:
    return _restore(kept_properties(task_id, priority, reply_to), _PROPERTY_SPEC, task_id)


def kept_properties(task_id: str, priority: int, reply_to: str | None = None
                    ) -> dict[str, Any]:
    """``task_properties``' values that differ from the defaults (``kept_headers``)."""
    kept: dict[str, Any] = {}
    if type(priority) is not int or priority:
        kept["priority"] = priority
    if reply_to is not None:
        kept["reply_to"] = reply_to
    return kept


# -- the compact envelope: how the Redis transport stores a message -------------------------
# Every message carries the same dozen headers, most at the value ``task_headers`` and
# ``task_properties`` give them (nulls, "py", 0, root_id and correlation_id equal to the
# id). The compact envelope keeps only what differs, and ``unpack`` puts the rest back:
# the message that comes out equals, key for key, the one that went in. Values compare by
# type too (a retries of False is not the default 0). A mapping that lacks one of those
# keys (another producer's) is kept whole, flagged not to be filled in.
_SAME_AS_ID: Any = object()
_HEADER_DEFAULTS: dict[str, Any] = {
    "lang": "py", "shadow": None, "eta": None, "expires": None, "group": None,
    "group_index": None, "retries": 0, "timelimit": [None, None], "root_id": _SAME_AS_ID,
    "parent_id": None, "argsrepr": "()", "kwargsrepr": "{}", "ignore_result": False,
}
_PROPERTY_DEFAULTS: dict[str, Any] = {
    "correlation_id": _SAME_AS_ID, "reply_to": None, "delivery_mode": 2, "priority": 0,
}
_EMPTY_BODY = b'[[],{},{"callbacks":null,"errbacks":null,"chain":null,"chord":null}]'
"""A no-argument call's JSON body (``producer/messages.py``): stored as nothing."""
_NO_DEFAULT: Any = object()


def pack(message: Message) -> tuple[bytes, bytes]:
    """``(envelope, body)``: ``[headers, properties, extra]`` in JSON with the default
    values left out (``extra`` only when needed), and the body (empty when it is the
    no-argument call's). ``unpack`` restores the message."""
    extra: dict[str, Any] = {}
    h: dict[str, Any] | None
    p: dict[str, Any] | None
    if message.kept is not None:
        h, p = message.kept
    else:
        task_id = message.headers.get("id")
        h = _strip(message.headers, _HEADER_DEFAULTS, task_id)
        if h is None:
            h, extra["wh"] = message.headers, 1
        p = _strip(message.properties, _PROPERTY_DEFAULTS, task_id)
        if p is None:
            p, extra["wp"] = message.properties, 1
    if message.content_type != "application/json":
        extra["ct"] = message.content_type
    if message.content_encoding != "utf-8":
        extra["ce"] = message.content_encoding
    body = message.body
    if body == _EMPTY_BODY and "ct" not in extra:
        extra["b"], body = 1, b""
    return orjson.dumps([h, p, extra] if extra else [h, p]), body


def unpack(envelope: bytes, body: bytes) -> Message:
    """The message of ``pack``'s ``(envelope, body)``; an ``envelope()`` (a JSON object,
    the form before the compact one) is read too."""
    if envelope[:1] != b"[":
        return Message.from_envelope(envelope, body)
    try:
        packed = orjson.loads(envelope)
        h, p = packed[0], packed[1]
        extra = packed[2] if len(packed) > 2 else {}
        if not (isinstance(h, dict) and isinstance(p, dict) and isinstance(extra, dict)):
            raise TypeError("not [headers, properties, extra] mappings")
        task_id = h.get("id")
        whole_h, whole_p = extra.get("wh"), extra.get("wp")
        headers = h if whole_h else _restore(h, _HEADER_SPEC, task_id)
        properties = p if whole_p else _restore(p, _PROPERTY_SPEC, task_id)
        ct, ce = extra.get("ct", "application/json"), extra.get("ce", "utf-8")
    except (orjson.JSONDecodeError, IndexError, TypeError) as exc:
        raise DecodeError(f"malformed message envelope: {exc}") from exc
    # The compact parts travel on: ``pack`` sends them again as they are, and the
    # worker's checks read them rather than every default restored around them.
    return Message(headers, _EMPTY_BODY if extra.get("b") else body, ct, ce, properties,
                   None if whole_h or whole_p else (h, p))


def _strip(values: dict[str, Any], defaults: dict[str, Any], task_id: Any
           ) -> dict[str, Any] | None:
    """``values`` without those at their default; None if it lacks one of them."""
    # One pass, no call per value: this runs for every message a producer sends. Most
    # values are their default's own object (None, False, 0): the identity test first.
    kept: dict[str, Any] = {}
    found = 0
    get = defaults.get
    for k, v in values.items():
        d = get(k, _NO_DEFAULT)
        if v is d:
            found += 1
        elif d is _NO_DEFAULT:
            kept[k] = v
        else:
            found += 1
            if d is _SAME_AS_ID:
                if type(v) is not str or v != task_id:
                    kept[k] = v
            elif v is None or d is None or type(v) is not type(d) or v != d:
                kept[k] = v
    return kept if found == len(defaults) else None


def _differs(v: Any, d: Any, task_id: Any) -> bool:
    """Whether ``v`` must be kept against its default ``d`` (``_strip``'s test, for one)."""
    if v is d:
        return False
    if d is _NO_DEFAULT:
        return True
    if d is _SAME_AS_ID:
        return type(v) is not str or v != task_id
    return v is None or d is None or type(v) is not type(d) or v != d


def _spec(defaults: dict[str, Any]
          ) -> tuple[dict[str, Any], tuple[str, ...], tuple[tuple[str, list[Any]], ...]]:
    """``defaults`` for ``_restore``: the plain values, the names equal to the id, the
    lists (copied for each message)."""
    same = tuple(k for k, v in defaults.items() if v is _SAME_AS_ID)
    lists = tuple((k, v) for k, v in defaults.items() if isinstance(v, list))
    plain = {k: v for k, v in defaults.items() if k not in same and not isinstance(v, list)}
    return plain, same, lists


_HEADER_SPEC = _spec(_HEADER_DEFAULTS)
_PROPERTY_SPEC = _spec(_PROPERTY_DEFAULTS)


def _restore(kept: dict[str, Any], spec: tuple[dict[str, Any], tuple[str, ...],
                                               tuple[tuple[str, list[Any]], ...]],
             task_id: Any) -> dict[str, Any]:
    plain, same, lists = spec
    out = plain.copy()
    for k in same:
        out[k] = task_id
    for k, v in lists:
        out[k] = list(v)
    out.update(kept)
    return out


MAX_ID = 255
"""Longest task id (and group, root and parent id) a worker accepts."""
MAX_NAME = 1024
"""Longest task name a worker accepts."""
MAX_LIMIT = 10.0 ** 8
"""Longest time limit a worker accepts, in seconds (over three years)."""
_ID_HEADERS = ("root_id", "parent_id", "group")
_TEXT_HEADERS = ("lang", "shadow", "argsrepr", "kwargsrepr", "origin")


def validate_headers(headers: Any) -> str | None:
    """The reason a header set is not a valid task message, or None.

    Every header the worker reads is checked here, by type and range, before anything
    uses it: a value that passes can be used without a guard (``timelimit`` is a pair of
    numbers or Nones, ``eta`` parses to a datetime, ``retries`` is a small int...).
    Headers the worker does not read are not checked, so newer producers' extras pass.

    ``headers`` may be a compact message's kept headers (``Message.kept``): the same
    answer as for the whole set, since every default ``unpack`` restores around them
    passes (``tests/unit/test_protocol.py``), and far fewer values to look at.
    """
    if not isinstance(headers, dict):
        return "headers are not a mapping"
    if DECODE_ERROR_HEADER in headers:
        return str(headers[DECODE_ERROR_HEADER])
    try:
        names: str | None = "".join(headers)  # one test of every name, not one each
    except TypeError:  # a name that is not a string
        names = None
    if names is None or not names.isascii():
        for key in headers:
            if not isinstance(key, str) or not _is_utf8(key):
                return f"header name {_show(key)} is not UTF-8 text"
    if reason := _check_identity(headers):
        return reason
    # The text headers inline, the others through their checks' table: this runs in the
    # worker's main process for every message, and most messages carry four of them.
    for name in _TEXT_HEADERS:
        value = headers.get(name)
        if value is not None and not isinstance(value, str):
            return f"{name!r} header {_show(value)} is not a string"
    for name, valid, not_what in _VALUE_CHECKS:
        value = headers.get(name)
        if value is not None and not valid(value):
            return f"{name!r} header {_show(value)} {not_what}"
    return None


def _check_identity(headers: dict[str, Any]) -> str | None:
    """The reason the task's name or its ids (its own, root, parent, group) are
    invalid, or None."""
    task = headers.get("task")
    if task is None:
        return "missing or invalid 'task' header: none (not a protocol v2 task message)"
    if not isinstance(task, str) or not task or len(task) > MAX_NAME:
        return f"missing or invalid 'task' header: {_show(task)}"
    reason = _check_id("id", headers.get("id"), required=True)
    if reason:
        return reason
    for name in _ID_HEADERS:
        value = headers.get(name)
        if value is not None and (reason := _check_id(name, value)):
            return reason
    return None


def validate_properties(message: Message) -> str | None:
    """The reason a message's content type or properties are invalid, or None."""
    ct = message.content_type
    if not isinstance(ct, str) or not _is_utf8(ct):
        return f"content type {_show(ct)} is not UTF-8 text"
    if not isinstance(message.content_encoding, str) or not _is_utf8(message.content_encoding):
        return f"content encoding {_show(message.content_encoding)} is not UTF-8 text"
    props = message.properties
    if not isinstance(props, dict):
        return "properties are not a mapping"
    priority = props.get("priority")
    if priority is not None and (type(priority) is not int or not 0 <= priority <= 255):
        return f"priority {_show(priority)} is not an integer from 0 to 255"
    return None


def valid_id(value: Any) -> bool:
    """A task, group, root or parent id a worker accepts: a short non-empty UTF-8 string."""
    return isinstance(value, str) and 0 < len(value) <= MAX_ID and _is_utf8(value)


def _check_id(name: str, value: Any, required: bool = False) -> str | None:
    if value is None and not required:
        return None
    if not valid_id(value):
        return f"missing or invalid {name!r} header: {_show(value)}"
    return None


def _valid_limits(limits: Any) -> bool:
    if not isinstance(limits, (list, tuple)) or len(limits) != 2:
        return False
    for value in limits:
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if not 0 <= value <= MAX_LIMIT:  # NaN fails this too
            return False
    return True


def _valid_retries(value: Any) -> bool:
    return type(value) is int and 0 <= value < 2 ** 31


def _valid_index(value: Any) -> bool:
    return type(value) is int and value >= 0


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _valid_time(value: Any) -> bool:
    return parse_time(value) is not None


_TIME = "is not an ISO 8601 time within years 1-9999"
_VALUE_CHECKS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    # (header, what a value that is not None must pass, what the reason says it is not)
    ("retries", _valid_retries, "is not an integer from 0 to 2**31-1"),
    ("group_index", _valid_index, "is not a non-negative integer"),
    ("ignore_result", _is_bool, "is not a boolean"),
    ("eta", _valid_time, _TIME),
    ("expires", _valid_time, _TIME),
    (compression.HEADER, compression.known, "is not a compression this worker can undo "
                                            f"({', '.join(compression.CONTENT_TYPES)})"),
    ("timelimit", _valid_limits,
     f"is not [hard, soft] with each a number of seconds from 0 to {MAX_LIMIT:.0e} or null"),
)
"""The headers beyond the name, the ids and the text headers, checked in this order by
type and range (absent or None: passed)."""


def _is_utf8(text: str) -> bool:
    # A transport that met bytes it could not decode keeps them as lone surrogates
    # (surrogateescape): such text cannot be encoded back, logged safely or stored.
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _show(value: Any, limit: int = 60) -> str:
    """A short, printable repr of a bad value for a dead letter's reason."""
    if isinstance(value, str) and not _is_utf8(value):
        value = value.encode("utf-8", "surrogateescape")
    try:
        text = repr(value)
    except Exception:
        text = "<unrepresentable>"
    text = text if len(text) <= limit else text[:limit - 3] + "..."
    return text if isinstance(value, (str, bytes)) else f"{text} ({type(value).__name__})"


def parse_time(value: Any) -> datetime | None:
    """An ``eta``/``expires`` value as an aware datetime; None if absent or invalid."""
    if value is None or isinstance(value, bool):
        return None
    try:
        if isinstance(value, (int, float)):
            return datetime.fromtimestamp(value, UTC)
        if not isinstance(value, str):
            return None
        parsed = datetime.fromisoformat(value)
    except (ValueError, OverflowError, OSError):
        return None  # beyond datetime's range, or not a time at all
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def decode_body(payload: Any) -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
    """Split a decoded v2 body into ``(args, kwargs, embed)``."""
    if (
        not isinstance(payload, (list, tuple))
        or len(payload) != 3
        or not isinstance(payload[0], (list, tuple))
        or not isinstance(payload[1], dict)
    ):
        raise DecodeError("body is not a protocol v2 [args, kwargs, embed] triple")
    embed = payload[2] if isinstance(payload[2], dict) else {}
    return list(payload[0]), payload[1], embed
