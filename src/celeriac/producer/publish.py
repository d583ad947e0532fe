"""Publishing what ``build`` makes: ``send`` (one message: ``send_task``'s, a
signature's), ``send_many`` (one task, many calls, in bulk round trips),
``publish_prepared`` (messages made by ``prepare``: a group's, a chord's header), each
with the ``before_publish``/``after_publish`` hooks, the publish's retry policy and the
``task-sent`` event."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import result as _result
from ..clients.net import retrying
from ..errors import ConfigurationError
from ..runtime import request as _request
from ..settings.routing import Route
from ..transports.base import Outgoing, Publisher
from . import batching as _batching
from . import builder as _builder
from . import flow as _flow
from . import outbox as _outbox
from .messages import split_call
from .options import SendOptions

if TYPE_CHECKING:
    from ..app import Celeriac
    from ..protocol import Message


def send(app: Celeriac, name: str, args: Sequence[Any] | None,
         kwargs: Mapping[str, Any] | None, options: SendOptions) -> _result.AsyncResult[Any]:
    """Build and publish one task message; its ``AsyncResult``."""
    sent_at = time.monotonic()
    flow = _flow.spec(app, name)
    if (flow is not None or options.fair_key is not None) and not _flow.applied(options):
        return _flow.send(app, name, args, kwargs, options, flow, send)  # then here again
    message, queue, delay = _builder.build(app, name, args, kwargs, options)
    task_id = message.headers["id"]
    if options.add_to_parent:
        current = _request.current_request()
        if current is not None:
            current.add_child(_result.AsyncResult(task_id, app, name))
    # The builder keeps the compact parts only where there are no hooks: one look.
    hooks = app.hooks if message.kept is None else None
    if hooks:
        hooks.call("before_publish", message, queue)
    # Inside ``app.transaction(conn)`` the message becomes an outbox row instead.
    publisher = _outbox.publisher(app)
    if options.retry is None and options.retry_policy is None:
        _publish(app, publisher, queue, message, delay, grouped=True)
    else:
        with _retrying(app, options.retry, options.retry_policy):
            _publish(app, publisher, queue, message, delay)
    if hooks:
        hooks.call("after_publish", message, queue)
    if app.settings.task_send_sent_event:
        sent_event(app, message, queue)
    result: _result.AsyncResult[Any] = _result.AsyncResult(task_id, app, name)
    result.sent_at = sent_at
    if options.ignore_result:
        result.ignored = True  # get() returns None at once (Celery's)
    return result


def _publish(app: Celeriac, publisher: Publisher, queue: str, message: Message,
             delay: float | None, *, grouped: bool = False) -> None:
    if isinstance(queue, Route):
        publisher.publish_many(expand(app, [Outgoing(queue, message, delay)]))
    elif grouped and (group := _batching.for_publisher(publisher)) is not None:
        # Concurrent callers share round trips (batching.py), each returning once its
        # own is confirmed; only under the default retry policy, which the leader's
        # round trip applies to all. A message too large fails its caller alone.
        publisher.check_size(message)
        group.publish([Outgoing(queue, message, delay)])
    else:
        publisher.publish(queue, message, delay=delay)


def expand(app: Celeriac, items: Sequence[Outgoing]) -> Sequence[Outgoing]:
    """``items`` with each ``Route`` (``settings/routing.py``) made what the broker
    takes: a copy per queue a topic exchange's bindings match, or one fanout publish.
    Raises ``ConfigurationError`` (nothing published) for a topic route no queue
    matches (RabbitMQ would drop it) or a fanout group on a broker without them."""
    if not any(isinstance(item.queue, Route) for item in items):
        return items
    out: list[Outgoing] = []
    for item in items:
        route = item.queue
        if not isinstance(route, Route):
            out.append(item)
        elif route.fanout:
            if not app.publisher.fanout:
                raise ConfigurationError(
                    f"cannot send {item.message.headers.get('task')}: queue {str(route)!r} "
                    f"is a fanout (Broadcast) queue, which {type(app.publisher).__name__} "
                    "does not have (use a Redis or RabbitMQ broker); nothing was published")
            # Copies go out now: an eta stays in the headers and each worker parks its copy.
            out.append(Outgoing(str(route), item.message, None, fanout=True))
        elif not route.queues:
            raise ConfigurationError(
                f"cannot send {item.message.headers.get('task')}: no queue bound to the topic "
                f"exchange {str(route)!r} matches its routing key; nothing was published")
        else:
            out.extend(Outgoing(queue, item.message, item.delay) for queue in route.queues)
    return out


def _retrying(app: Celeriac, retry: bool | None, policy: Mapping[str, Any] | None) -> Any:
    limit = (policy or {}).get("max_retries", app.settings.broker_connection_max_retries)
    return retrying(retry if retry is not None else True, limit)


def send_many(app: Celeriac, name: str,
              calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]] | Sequence[Any]],
              options: SendOptions, chunk_size: int) -> list[_result.AsyncResult[Any]]:
    """One message per call (args, or ``(args, kwargs)``), each built before its chunk
    is published (``chunk_size`` per round trip)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size!r}")
    if options.fair_key is not None:
        options = _flow.with_fair(app, options)
    results: list[_result.AsyncResult[Any]] = []
    chunk: list[Outgoing] = []
    for call in calls:
        args, kwargs = split_call(call)
        message, q, delay = _builder.build(app, name, args, kwargs, options)
        chunk.append(Outgoing(q, message, delay))
        results.append(_result.AsyncResult(message.headers["id"], app, name))
        if len(chunk) >= chunk_size:
            publish_chunk(app, chunk)
            chunk = []
    if chunk:
        publish_chunk(app, chunk)
    return results


def publish_prepared(app: Celeriac, items: Iterable[Outgoing], *, chunk_size: int = 1000,
                     retry: bool | None = None,
                     retry_policy: Mapping[str, Any] | None = None) -> int:
    """Publish messages made by ``prepare``, ``chunk_size`` per broker round trip (hooks
    and ``task-sent`` events as ``send``); returns how many."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size!r}")
    sent = 0
    chunk: list[Outgoing] = []

    def flush() -> None:
        if retry is None and retry_policy is None:
            publish_chunk(app, chunk)
            return
        with _retrying(app, retry, retry_policy):
            publish_chunk(app, chunk)

    try:
        for item in items:
            chunk.append(item)
            if len(chunk) >= chunk_size:
                flush()
                sent, chunk = sent + len(chunk), []
        if chunk:
            flush()
            sent += len(chunk)
    except BaseException:
        # The chunk in hand was not published (a refused publish, or a later item that
        # could not be prepared): the unique locks its steps took would otherwise keep
        # the next delay() out until unique_for lapsed. Those of earlier chunks stay:
        # their messages are in the broker.
        _flow.release_unsent(app, ((i.message.headers["id"], i.message.headers)
                                   for i in chunk))
        raise
    return sent


def publish_one(app: Celeriac, queue: str, message: Message, delay: float | None) -> None:
    """Publish a message ``build`` made, with the hooks (what a worker sends after a
    task: ``canvas.followups``; its retry policy is the caller's)."""
    hooks = app.hooks
    if hooks:
        hooks.call("before_publish", message, queue)
    try:
        _publish(app, app.publisher, queue, message, delay)
    except BaseException:
        _flow.release_unsent(app, [(message.headers["id"], message.headers)])
        raise
    if hooks:
        hooks.call("after_publish", message, queue)


def publish_chunk(app: Celeriac, chunk: list[Outgoing]) -> None:
    """One broker round trip, with the hooks and events of each message."""
    if app.hooks:
        for item in chunk:
            app.hooks.call("before_publish", item.message, item.queue)
    _outbox.publisher(app).publish_many(expand(app, chunk) if app.routing.special else chunk)
    if app.hooks:
        for item in chunk:
            app.hooks.call("after_publish", item.message, item.queue)
    if app.settings.task_send_sent_event:
        for item in chunk:
            sent_event(app, item.message, item.queue)


def sent_event(app: Celeriac, message: Message, queue: str) -> None:
    """The ``task-sent`` event (``task_send_sent_event``)."""
    h = message.headers
    fields: dict[str, Any] = {}
    if not app.settings.events_hide_args:
        fields["args"], fields["kwargs"] = h.get("argsrepr"), h.get("kwargsrepr")
    app.events.send("task-sent", uuid=h["id"], name=h["task"], retries=h.get("retries"),
                    eta=h.get("eta"), expires=h.get("expires"), queue=queue,
                    root_id=h.get("root_id"), parent_id=h.get("parent_id"), **fields)
