"""Results as messages back to the caller (``result_backend="rpc://"``): Celery's RPC
backend, on the AMQP broker (``broker_url``), with Celery's wire format.

Each client process has one reply queue, named by a uuid (``reply_to``): declared on the
first send (before the message leaves, so no reply can be published to a queue that does
not exist yet) as Celery declares its own: durable, ``auto_delete``, and ``x-expires`` of
``result_expires`` (an unused queue goes away). A task message carries it in its
``reply_to`` property and its id in ``correlation_id``; the worker publishes each state
it stores (``STARTED`` with ``task_track_started``, retries, custom states, the result)
through the default exchange to that queue, with the task id as ``correlation_id`` and
the result's meta as the body (Celery's: ``status``, ``result``, ``traceback``,
``date_done``, ``children``, ``task_id``). Only the process that sent the task reads it,
and results are not persistent: a result is read once, by its caller, from memory.

A chain's result reaches the process that sent the chain whichever workers run its
steps: as Celery's ``freeze`` does, each step carries the caller's queue in its options
(``reply_to``: ``canvas.signature.reply_queue``), and the worker that sends a step sends
it with that queue, Celery's worker as ours. A task sent from inside a task without one
(a callback) replies to the queue of the message that task came from (``reply_to``).

Limits, Celery's: a result lives in the caller's memory only (another process cannot
read it; ``GroupResult.save``/``restore`` and ``forget`` across processes do not exist),
and chords are refused (``ensure_chords_allowed``): a chord's body needs its header's
results, and those went to the caller. No shared store can hold them instead: rpc://
replies through an AMQP broker (``broker_parameters`` refuses any other), and neither
rpc:// nor RabbitMQ is a store (``stores.find_url`` finds none), so a deployment on
rpc:// never has one; chords need a result backend that stores results.

Reading: the reply queue is consumed (no ack, as Celery's) on one connection per process
by whichever waiting thread holds it; the latest state per task id is kept (bounded,
oldest first out). A reply whose task this process is not waiting for yet is kept too,
for a later ``get()``. Publishing: a connection per thread (pika's are not thread-safe).
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit, urlunsplit

import pika
import pika.exceptions

from ..clients.net import mask_password
from ..errors import BrokerUnavailable, ConfigurationError
from ..runtime.request import current_request
from .base import GROUP_KEY_PREFIX, ResultBackend, Stored

if TYPE_CHECKING:
    from ..settings import Settings

log = logging.getLogger("celeriac.backends.rpc")

KEPT = 10_000
"""Replies kept per process (the latest state of each task), oldest dropped first."""
_HEAD = struct.Struct(">HH")
_PIKA_ERRORS = (pika.exceptions.AMQPError, OSError)
E_NO_CHORDS = ("the rpc:// result backend does not support chords: a chord's body needs "
               "its header's results, and on rpc:// those go to the caller's reply queue, "
               "where no worker can read them (a group chained with a task is a chord too); "
               "nor is there a shared store to keep them, since rpc:// needs an AMQP broker "
               "and neither is a store. For chords, use a result backend that stores "
               "results: redis://, postgresql://, mysql:// or sqlite:// (the broker can "
               "stay amqp://)")
E_NO_GROUPS = ("the rpc:// result backend keeps no results another process can read: "
               "GroupResult.save/restore is not supported (nor chords, which save their "
               "header); use a redis://, postgresql://, mysql:// or sqlite:// result backend")


class NotSupportedByRPC(ConfigurationError, NotImplementedError):
    """What rpc:// cannot do (Celery raises ``NotImplementedError`` for the same)."""


def broker_parameters(settings: Settings) -> list[pika.URLParameters]:
    """pika's parameters for each AMQP broker URL, in failover order (our query options
    dropped); pika's connection tries them in turn."""
    found = []
    for url in (u.strip() for u in settings.broker_url.split(";") if u.strip()):
        parts = urlsplit(url)
        if parts.scheme not in ("amqp", "amqps", "pyamqp"):
            raise ConfigurationError(
                f"the rpc:// result backend replies through an AMQP broker, and broker_url "
                f"is {mask_password(url)}: use an amqp:// broker, or a result backend that "
                "stores results (redis://, postgresql://, mysql://, sqlite://)")
        scheme = "amqps" if parts.scheme == "amqps" else "amqp"
        params = pika.URLParameters(urlunsplit(parts._replace(scheme=scheme, query="")))
        path = parts.path
        params.virtual_host = "/" if path in ("", "/") else unquote(path[1:])
        params.socket_timeout = params.stack_timeout = settings.broker_connection_timeout
        # No heartbeats (kombu's client default): a caller that sends, then reads its
        # results minutes later, calls nothing on the connection meanwhile, and a broker
        # that closed it for missed heartbeats would delete the reply queue with it.
        params.heartbeat = 0
        found.append(params)
    return found


def pack(reply_to: str, correlation_id: str, body: bytes) -> bytes:
    """A reply's destination and body in ``Stored.data``: where it goes crosses the pool's
    pipe with it, from the child that ran the task to the process that publishes it."""
    to, cid = reply_to.encode(), correlation_id.encode()
    return _HEAD.pack(len(to), len(cid)) + to + cid + body


def unpack(data: bytes) -> tuple[str, str, bytes]:
    to_len, cid_len = _HEAD.unpack_from(data)
    start = _HEAD.size
    to = data[start:start + to_len].decode()
    cid = data[start + to_len:start + to_len + cid_len].decode()
    return to, cid, data[start + to_len + cid_len:]


class _Process:
    """This process's reply queue, its reading connection and the replies read."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.queue = str(uuid.uuid4())
        self.declared = False
        self.conn: Any = None
        self.channel: Any = None
        self.lock = threading.Lock()  # held by the one thread reading the queue
        self.consuming = False
        self.changed = threading.Condition()
        self.version = 0
        self.replies: dict[str, tuple[str, bytes, bool]] = {}
        """Task id -> the latest reply's content type and body, and whether it is final."""

    def close(self) -> None:
        if self.conn is not None and self.pid == os.getpid():
            with contextlib.suppress(*_PIKA_ERRORS):  # already gone: nothing to release
                self.conn.close()
        self.conn = self.channel = None
        self.declared = self.consuming = False


class RPCBackend(ResultBackend):
    scheme = "rpc"
    expires_alone = True  # the broker expires an unused reply queue; nothing to clean
    compresses = False  # replies go as Celery's, uncompressed

    def __init__(self, url: str, settings: Settings) -> None:
        super().__init__(url, settings)
        self._params = broker_parameters(settings)
        self._safe = mask_password(settings.broker_url)
        self._guard = threading.Lock()
        self._process = _Process()
        self._local = threading.local()
        self._seen = threading.local()

    # -- the caller's side --------------------------------------------------------------
    @property
    def reply_to(self) -> str:
        """Where replies to a task sent now go: the running task's own reply queue (a
        follow-up replies to the caller of the workflow), else this process's, declared
        on first use."""
        request = current_request()
        if request is not None:
            inherited = request.properties.get("reply_to")
            if inherited:
                return str(inherited)
        process = self._mine()
        if not process.declared:
            with process.lock:
                if not process.declared:
                    self._open(process)
        return process.queue

    def _mine(self) -> _Process:
        if self._process.pid != os.getpid():
            with self._guard:
                if self._process.pid != os.getpid():
                    self._process = _Process()  # a forked child replies to a queue of its own
        return self._process

    def _open(self, process: _Process, consume: bool = False) -> None:
        """Connect and declare the reply queue (Celery's arguments); consume it too when
        asked. A queue is consumed only once its caller reads: ``auto_delete`` deletes
        it when its last consumer goes, never before it had one."""
        process.close()
        try:
            conn = pika.BlockingConnection(self._params)
            channel = conn.channel()
            expires = self.settings.result_expires
            channel.queue_declare(process.queue, durable=True, auto_delete=True, arguments={
                "x-expires": int(expires * 1000)} if expires else None)
            if consume:
                channel.basic_consume(process.queue, self._on_reply(process), auto_ack=True)
        except _PIKA_ERRORS as exc:
            raise BrokerUnavailable(f"rpc:// result backend: cannot declare the reply queue "
                                    f"on {self._safe}: {exc!r}") from exc
        process.conn, process.channel, process.declared = conn, channel, True
        process.consuming = consume

    def _on_reply(self, process: _Process) -> Any:
        def on_reply(channel: Any, method: Any, props: Any, body: bytes) -> None:
            task_id = props.correlation_id
            if not task_id:
                return
            content_type = props.content_type or "application/json"
            final = self._final(task_id, content_type, bytes(body))
            replies = process.replies
            # A task's states come from two processes (STARTED from the pool child, the
            # result from the worker's main process), on two connections, which the
            # broker need not deliver in order: a final state is never replaced by an
            # earlier one that arrives after it.
            held = replies.pop(task_id, None)  # the latest state moves to the end
            replies[task_id] = held if held is not None and held[2] and not final \
                else (content_type, bytes(body), final)
            while len(replies) > KEPT:
                del replies[next(iter(replies))]
            with process.changed:
                process.version += 1
                process.changed.notify_all()

        return on_reply

    def _final(self, task_id: str, content_type: str, body: bytes) -> bool:
        try:
            return self._decode(task_id, content_type, body).ready
        except Exception:  # a reply we cannot read: get() raises the reason when it reads
            return True

    def _pump(self, process: _Process, timeout: float) -> None:
        """Read what the reply queue holds, waiting up to ``timeout`` for the first."""
        try:
            if process.conn is None or not process.conn.is_open:
                self._open(process, consume=True)
            elif not process.consuming:
                process.channel.basic_consume(process.queue, self._on_reply(process),
                                              auto_ack=True)
                process.consuming = True
            process.conn.process_data_events(time_limit=max(timeout, 0))
        except _PIKA_ERRORS as exc:
            # Replies published while the connection was down wait in the queue (it is
            # not deleted while the next connection consumes again within x-expires).
            log.warning("rpc:// result backend: reading replies from %s failed (%r); "
                        "reconnecting", self._safe, exc)
            process.close()

    def _get(self, task_ids: Sequence[str]) -> dict[str, tuple[str, bytes]]:
        process = self._mine()
        if process.lock.acquire(blocking=False):
            try:
                self._pump(process, 0)
            finally:
                process.lock.release()
        self._seen.version = process.version
        replies = process.replies
        found = {t: replies.get(t) for t in task_ids}
        return {t: (reply[0], reply[1]) for t, reply in found.items() if reply is not None}

    def _wait(self, timeout: float) -> None:
        process = self._mine()
        deadline = time.monotonic() + timeout
        seen = getattr(self._seen, "version", -1)
        while process.version == seen:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            if process.lock.acquire(blocking=False):
                try:
                    self._pump(process, remaining)
                finally:
                    process.lock.release()
            else:
                # Another thread reads the queue: it wakes us when a reply comes, and
                # we look again now and then in case it stopped reading first.
                with process.changed:
                    if process.version == seen:
                        process.changed.wait(min(remaining, 0.05))

    def forget(self, task_id: str) -> None:
        self._mine().replies.pop(task_id, None)

    def cleanup(self) -> int:
        return 0

    # -- the worker's side -------------------------------------------------------------
    def encode(self, task_id: str, state: str, result: Any, *, traceback: str | None = None,
               retries: int = 0, extended: dict[str, Any] | None = None,
               properties: Mapping[str, Any] | None = None) -> Stored:
        if task_id.startswith(GROUP_KEY_PREFIX):
            raise NotSupportedByRPC(E_NO_GROUPS)
        stored = super().encode(task_id, state, result, traceback=traceback, retries=retries,
                                extended=extended)
        if properties is None:
            request = current_request()  # a task's own update_state()
            properties = request.properties if request is not None \
                and request.id == task_id else {}
        reply_to = str(properties.get("reply_to") or "")
        correlation_id = str(properties.get("correlation_id") or task_id)
        return stored._replace(data=pack(reply_to, correlation_id, stored.data))

    def store_many(self, items: Sequence[Stored]) -> None:
        replies = []
        for item in items:
            reply_to, correlation_id, body = unpack(item.data)
            if reply_to:
                replies.append((reply_to, correlation_id, item.content_type, body))
            else:  # Celery does the same: a message without reply_to has no caller
                log.debug("Task %s: no reply_to, its state is not sent", item.task_id)
        if replies:
            self._publish(replies)

    def _publish(self, replies: list[tuple[str, str, str, bytes]]) -> None:
        for attempt in (1, 2):
            channel = self._channel()
            try:
                for reply_to, correlation_id, content_type, body in replies:
                    channel.basic_publish("", reply_to, body, pika.BasicProperties(
                        content_type=content_type, correlation_id=correlation_id,
                        content_encoding="utf-8" if content_type == "application/json"
                        else "binary", delivery_mode=1))
                return
            except _PIKA_ERRORS as exc:
                self._drop_channel()
                if attempt == 2:
                    raise BrokerUnavailable(f"rpc:// result backend: cannot publish "
                                            f"replies on {self._safe}: {exc!r}") from exc
                log.warning("rpc:// result backend: publishing on %s failed (%r); "
                            "reconnecting", self._safe, exc)

    def _channel(self) -> Any:
        held = getattr(self._local, "held", None)
        if held is not None and held[0] == os.getpid() and held[1].is_open:
            return held[2]
        try:
            conn = pika.BlockingConnection(self._params)
            channel = conn.channel()
        except _PIKA_ERRORS as exc:
            raise BrokerUnavailable(f"rpc:// result backend: cannot connect to "
                                    f"{self._safe}: {exc!r}") from exc
        self._local.held = (os.getpid(), conn, channel)
        return channel

    def _drop_channel(self) -> None:
        held = getattr(self._local, "held", None)
        self._local.held = None
        if held is not None and held[0] == os.getpid():
            with contextlib.suppress(*_PIKA_ERRORS):  # already broken: why it is dropped
                held[1].close()

    # -- what rpc:// cannot do ---------------------------------------------------------
    def ensure_chords_allowed(self) -> None:
        raise NotSupportedByRPC(E_NO_CHORDS)

    def chord_part(self, group_id: str, task_id: str, size: int) -> bool:
        raise NotSupportedByRPC(E_NO_CHORDS)

    def close(self) -> None:
        self._drop_channel()
        process = self._process
        if process.pid == os.getpid():
            with process.lock:
                process.close()
