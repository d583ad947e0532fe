"""Building task messages: ``build`` (every send's hot path: arguments checked, lineage,
the body encoded once with its embed, compression, headers, the queue) and ``prepare``
(``build`` as an ``Outgoing``, the send recorded among the running task's children)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, timedelta
from typing import TYPE_CHECKING, Any

from .. import result as _result
from ..errors import ConfigurationError, MessageTooLarge
from ..protocol import Message, kept_headers, kept_properties, new_id, utcnow
from ..runtime import request as _request
from ..serialization import compression as _compression
from ..transports.base import Outgoing
from . import flow as _flow
from .messages import absolute_time, encode_body
from .options import SendOptions

if TYPE_CHECKING:
    from ..app import Celeriac

logger = logging.getLogger("celeriac.producer")


def prepare(app: Celeriac, name: str, args: Sequence[Any] | None,
            kwargs: Mapping[str, Any] | None, options: SendOptions, *,
            lenient: bool = False) -> Outgoing:
    """The message ``send_task`` would publish, unpublished (a group publishes a chunk of
    them per round trip; ``publish.publish_prepared``); recorded among the running task's
    children as ``send_task`` does. A workflow step's flow options apply
    (``flow.step``: its unique lock, or its stand-in)."""
    stepped = _flow.step(app, name, args, kwargs, options)
    try:
        message, queue, delay = build(app, *stepped, lenient=lenient)
    except BaseException:  # unbuilt (an argument that cannot be serialized): unsent
        _flow.release_unsent(app, [(stepped[3].task_id or "", stepped[3].headers)])
        raise
    if options.add_to_parent:
        current = _request.current_request()
        if current is not None:
            current.add_child(_result.AsyncResult(message.headers["id"], app, name))
    return Outgoing(queue, message, delay)


def build(app: Celeriac, name: str, args: Sequence[Any] | None,
          kwargs: Mapping[str, Any] | None, options: SendOptions, *,
          lenient: bool = False) -> tuple[Message, str, float | None]:
    """A task message, its queue and its delay (seconds, or None). ``options`` are
    taken as checked (``SendOptions.check``). ``lenient`` is a worker's follow-up's
    policy: a compression it cannot apply is logged and the message sent uncompressed,
    where a producer raises and publishes nothing."""
    # The checks and the lineage headers are one call each; the rest stays inline: this
    # runs for every delay(), and a call costs about a tenth of a microsecond.
    _check_call(app, name, args, kwargs, options)
    o = options
    extra = _extra_headers(o)
    args, kwargs = list(args or ()), dict(kwargs or {})
    task_id = o.task_id or new_id()
    now = utcnow()
    eta = o.eta
    if o.countdown is not None:
        eta = now + timedelta(seconds=o.countdown) if o.countdown > 0 else None
    if eta is not None and eta.tzinfo is None:
        eta = eta.replace(tzinfo=UTC)
    delay = (eta - now).total_seconds() if eta is not None else None
    settings = app.settings
    serializer = o.serializer or settings.task_serializer
    content_type, body = encode_body(name, args, kwargs, serializer, o.embed)
    compression = o.compression or settings.task_compression
    if compression is not None:
        body = _compress(name, task_id, body, compression, extra, settings.max_message_size,
                         lenient)
    a_repr, k_repr = _request.args_repr(args, kwargs)
    h = kept_headers(
        task=name, task_id=task_id, args_repr=a_repr, kwargs_repr=k_repr, eta=eta,
        expires=absolute_time(o.expires, now), retries=o.retries, time_limit=o.time_limit,
        soft_time_limit=o.soft_time_limit, ignore_result=o.ignore_result,
        extra=extra or None,
    )
    priority = o.priority
    if priority is None:
        priority = settings.task_default_priority
    # rpc://: replies go to the caller's queue, named in the message (Celery's reply_to);
    # a frozen signature names it (a chain's later steps, sent by any worker).
    reply_to = o.reply_to
    if reply_to is None and settings.result_backend is not None \
            and settings.result_backend[:3] == "rpc":
        reply_to = getattr(app.backend, "reply_to", None)
    p = kept_properties(task_id, priority, reply_to)
    if o.app_id is not None:
        p["app_id"] = o.app_id
    message = Message.built(h, p, body, content_type)
    if app.hooks:
        # Hooks may change the headers in place (before_publish): pack then compares
        # them anew. (A hook added between here and the publish would be missed.)
        message = Message(message.headers, body, content_type, "utf-8", message.properties)
    if app.routing.special:  # a fanout group or a topic exchange: maybe a Route
        queue = app.routing.resolve(o.queue, o.exchange, o.routing_key) or app.route(name)
    else:
        queue = o.queue or (app.queue_for_key(o.routing_key) if o.routing_key else None) \
            or app.route(name)
    if not settings.task_create_missing_queues:
        _check_queue(app, name, queue, lenient)
    return message, queue, delay


def _check_call(app: Celeriac, name: str, args: Sequence[Any] | None,
                kwargs: Mapping[str, Any] | None, o: SendOptions) -> None:
    """Refuse a call ``build`` cannot send: a bad name, arguments or exchange."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    # Exact types first: the ABC checks cost a microsecond each, on every message.
    if args is not None and type(args) not in (tuple, list) and (
            isinstance(args, (str, bytes)) or not isinstance(args, Sequence)):
        raise TypeError(f"args must be a list or tuple, got {type(args).__name__}")
    if kwargs is not None and type(kwargs) is not dict and not isinstance(kwargs, Mapping):
        raise TypeError(f"kwargs must be a mapping, got {type(kwargs).__name__}")
    if o.exchange is not None and not app.routing.allows(o.exchange, None):
        raise ConfigurationError(f"send_task({name!r}): exchange={o.exchange!r} is not "
                                 "supported: messages go to the queue named by queue= "
                                 "or routing_key= (or bound by it in task_queues); "
                                 "nothing was sent")


def _extra_headers(o: SendOptions) -> dict[str, Any]:
    """The headers beyond ``task_headers``' own arguments: the call's ``headers``, then
    the shadow name, the group and the lineage (``parent_id``, ``root_id``: the options',
    else those of the task running now, when ``add_to_parent``)."""
    extra = dict(o.headers) if o.headers else {}
    if o.shadow is not None:
        extra["shadow"] = o.shadow
    if o.group_id is not None:
        extra["group"] = o.group_id
    if o.group_index is not None:
        extra["group_index"] = o.group_index
    if o.argsrepr is not None:
        extra["argsrepr"] = o.argsrepr
    if o.kwargsrepr is not None:
        extra["kwargsrepr"] = o.kwargsrepr
    current = _request.current_request() if o.add_to_parent else None
    if o.parent_id is not None or current is not None:
        extra["parent_id"] = o.parent_id or (current.id if current else None)
    if o.root_id is not None or current is not None:
        extra["root_id"] = o.root_id or (current.root_id or current.id if current else None)
    return extra


def _compress(name: str, task_id: str, body: bytes, compression: str,
              extra: dict[str, Any], limit: int, lenient: bool) -> bytes:
    """``body`` compressed, its ``compression`` header set in ``extra``. A producer
    refuses a body over ``limit`` or a compression it cannot apply (nothing is
    published); a worker's follow-up (``lenient``) is sent uncompressed instead."""
    if lenient:
        if len(body) <= limit:
            if _compression.known_name(compression):
                extra[_compression.HEADER], body = _compression.compress(body, compression)
            else:
                logger.warning("Task %s[%s]: unknown compression %r in its options: "
                               "sent uncompressed", name, task_id, compression)
    elif len(body) > limit:
        # A worker refuses what expands past it: say so here, as for a plain body.
        raise MessageTooLarge(
            f"message for task {name!r} is {len(body)} bytes before compression, "
            f"over max_message_size={limit}; nothing was published")
    else:
        try:
            extra[_compression.HEADER], body = _compression.compress(body, compression)
        except ConfigurationError as exc:
            raise ConfigurationError(f"cannot send {name}: {exc}; nothing was "
                                     "published") from None
    return body


def _check_queue(app: Celeriac, name: str, queue: str, lenient: bool) -> None:
    """Refuse a queue ``task_queues`` does not declare (``task_create_missing_queues``
    off)."""
    try:
        app.routing.check(queue)
    except ConfigurationError as exc:
        if lenient:
            raise
        raise ConfigurationError(f"cannot send {name}: {exc}; nothing was "
                                 "published") from None
