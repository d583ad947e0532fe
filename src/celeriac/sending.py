"""Building task messages: ``build`` (the hot path of every send: body, headers,
compression, the queue) and ``prepare`` (``send_task`` without the publish: lineage,
a canvas embed, the routing key's queue). ``Celeriac.send_task``, ``send_many`` and the
canvas publish what these return."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from . import compression as _compression
from . import result as _result
from . import serialization
from ._messages import EMPTY_EMBED, absolute_time, encode_body, validate_priority
from .errors import ConfigurationError, MessageTooLarge
from .protocol import Message, new_id, task_headers, task_properties, utcnow
from .tasks import args_repr, current_request
from .transports.base import Outgoing

if TYPE_CHECKING:
    from .app import Celeriac


def prepare(
    app: Celeriac, name: str, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None, *,
    embed: Mapping[str, Any] | None = None, group_index: int | None = None,
    countdown: float | None = None, eta: datetime | None = None,
    expires: float | timedelta | datetime | None = None, queue: str | None = None,
    priority: int | None = None, task_id: str | None = None,
    headers: Mapping[str, Any] | None = None, serializer: str | None = None,
    retries: int = 0, time_limit: float | None = None,
    soft_time_limit: float | None = None, ignore_result: bool = False,
    shadow: str | None = None, routing_key: str | None = None,
    exchange: str | None = None, parent_id: str | None = None, root_id: str | None = None,
    group_id: str | None = None, add_to_parent: bool = True,
    compression: str | None = None,
) -> Outgoing:
    """A message as ``send_task`` would publish it, with a canvas ``embed`` (chain,
    callbacks, errbacks) and a ``group_index``; ``publish_prepared`` sends it.

    Canvas builds messages ahead of publishing them (a group: a chunk of messages per
    round trip), so this is ``send_task`` without the publish."""
    if not app.routing.allows(exchange, None):
        raise ConfigurationError(f"send_task({name!r}): exchange={exchange!r} is not "
                                 "supported: messages go to the queue named by queue= "
                                 "or routing_key= (or bound by it in task_queues); "
                                 "nothing was sent")
    extra = dict(headers) if headers else {}
    if shadow is not None:
        extra["shadow"] = shadow
    if group_id is not None:
        extra["group"] = group_id
    if group_index is not None:
        extra["group_index"] = group_index
    current = current_request() if add_to_parent else None
    if parent_id is not None or current is not None:
        extra["parent_id"] = parent_id or (current.id if current else None)
    if root_id is not None or current is not None:
        extra["root_id"] = root_id or (current.root_id or current.id if current else None)
    message, queue, delay = build(app,
        name, args, kwargs, countdown=countdown, eta=eta, expires=expires,
        queue=queue or (app.queue_for_key(routing_key) if routing_key else None),
        priority=priority, task_id=task_id,
        headers=extra or None, serializer=serializer, retries=retries,
        time_limit=time_limit, soft_time_limit=soft_time_limit,
        ignore_result=ignore_result, compression=compression,
    )
    if current is not None:
        current.add_child(_result.AsyncResult(message.headers["id"], app, name))
    if embed:
        # build (the hot path of every send) always writes an empty embed: encode
        # the body again here rather than slow it down with a parameter.
        content_type, body = serialization.dumps(
            (list(args or ()), dict(kwargs or {}), {**EMPTY_EMBED, **embed}),
            serializer or app.settings.task_serializer)
        if _compression.HEADER in message.headers:
            _, body = _compression.compress(body, message.headers[_compression.HEADER])
        message = Message(message.headers, body, content_type, message.content_encoding,
                          message.properties)
    return Outgoing(queue, message, delay)


def build(
    app: Celeriac, name: str, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None, *,
    countdown: float | None, eta: datetime | None,
    expires: float | timedelta | datetime | None, queue: str | None,
    priority: int | None, task_id: str | None, headers: Mapping[str, Any] | None,
    serializer: str | None, retries: int, time_limit: float | None,
    soft_time_limit: float | None, ignore_result: bool, compression: str | None = None,
) -> tuple[Message, str, float | None]:
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    # Exact types first: the ABC checks cost a microsecond each, on every message.
    if args is not None and type(args) not in (tuple, list) and (
            isinstance(args, (str, bytes)) or not isinstance(args, Sequence)):
        raise TypeError(f"args must be a list or tuple, got {type(args).__name__}")
    if kwargs is not None and type(kwargs) is not dict and not isinstance(kwargs, Mapping):
        raise TypeError(f"kwargs must be a mapping, got {type(kwargs).__name__}")
    if priority is not None:
        validate_priority(priority)
    if countdown is not None and eta is not None:
        raise ValueError("give countdown or eta, not both")
    args, kwargs = list(args or ()), dict(kwargs or {})
    task_id = task_id or new_id()
    now = utcnow()
    if countdown is not None:
        if not isinstance(countdown, (int, float)):
            raise TypeError(f"countdown must be a number of seconds, got {countdown!r}")
        eta = now + timedelta(seconds=countdown) if countdown > 0 else None
    if eta is not None and eta.tzinfo is None:
        eta = eta.replace(tzinfo=UTC)
    delay = (eta - now).total_seconds() if eta is not None else None
    serializer = serializer or app.settings.task_serializer
    content_type, body = encode_body(name, args, kwargs, serializer)
    compression = compression or app.settings.task_compression
    if compression is not None:
        if len(body) > app.settings.max_message_size:
            # A worker refuses what expands past it: say so here, as for a plain body.
            raise MessageTooLarge(
                f"message for task {name!r} is {len(body)} bytes before compression, "
                f"over max_message_size={app.settings.max_message_size}; nothing was "
                "published")
        try:
            kind, body = _compression.compress(body, compression)
        except ConfigurationError as exc:
            raise ConfigurationError(f"cannot send {name}: {exc}; nothing was "
                                     "published") from None
        headers = {**(headers or {}), _compression.HEADER: kind}
    a_repr, k_repr = args_repr(args, kwargs)
    h = task_headers(
        task=name, task_id=task_id, args_repr=a_repr, kwargs_repr=k_repr, eta=eta,
        expires=absolute_time(expires, now), retries=retries, time_limit=time_limit,
        soft_time_limit=soft_time_limit, ignore_result=ignore_result,
        extra=dict(headers) if headers else None,
    )
    if priority is None:
        priority = app.settings.task_default_priority
    message = Message(h, body, content_type, "utf-8", task_properties(task_id, priority))
    queue = queue or app.route(name)
    if not app.settings.task_create_missing_queues:
        try:
            app.routing.check(queue)
        except ConfigurationError as exc:
            raise ConfigurationError(f"cannot send {name}: {exc}; nothing was "
                                     "published") from None
    return message, queue, delay
