"""Server-sent events: one bounded queue per browser, and the response that drains it.

A message is encoded once and offered to every client without waiting. A client whose
queue is full (it reads slower than the cluster changes) is dropped: its queue is emptied
and its stream ends; the browser's EventSource reconnects and reloads what it shows. So
a slow or stuck client costs at most ``maxsize`` messages of memory and never delays
the others or the event receiver.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import orjson

logger = logging.getLogger("celeriac.dashboard.stream")

KEEPALIVE = 15.0
"""Seconds between comment lines on an idle stream, so proxies keep it open."""
WRITE_TIMEOUT = 10.0
"""A client that has not taken one chunk in this long is dropped."""
RETRY_MS = 2000


def encode(event: str, data: Any) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(
        data, default=str, option=orjson.OPT_NON_STR_KEYS) + b"\n\n"


class Client:
    """One connected stream."""

    def __init__(self, maxsize: int, peer: str = "?") -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize)
        self.peer = peer
        self.dropped = False

    def offer(self, chunk: bytes) -> bool:
        if self.dropped:
            return False
        try:
            self.queue.put_nowait(chunk)
            return True
        except asyncio.QueueFull:
            self.drop()
            return False

    def drop(self) -> None:
        """Forget what is queued and end the stream at the next read."""
        self.dropped = True
        while not self.queue.empty():
            self.queue.get_nowait()
        self.queue.put_nowait(None)


class Hub:
    """The set of connected clients."""

    def __init__(self, client_queue_size: int = 64) -> None:
        self.client_queue_size = client_queue_size
        self.clients: set[Client] = set()
        self.dropped_total = 0
        self.closed = False

    def subscribe(self, peer: str = "?") -> Client:
        client = Client(self.client_queue_size, peer)
        if self.closed:
            client.drop()  # shutting down: the stream ends at once
        else:
            self.clients.add(client)
        return client

    def unsubscribe(self, client: Client) -> None:
        self.clients.discard(client)

    def publish(self, event: str, data: Any) -> None:
        chunk = encode(event, data)
        for client in list(self.clients):
            if not client.offer(chunk):
                self.clients.discard(client)
                self.dropped_total += 1
                logger.warning("dropped a slow event-stream client (%s): %d messages "
                               "behind", client.peer, self.client_queue_size)

    def close(self) -> None:
        """End every stream, now and for clients that connect from now on."""
        self.closed = True
        for client in list(self.clients):
            client.drop()
        self.clients.clear()


Scope = dict[str, Any]
Message = dict[str, Any]


class EventStream:
    """ASGI response writing one client's queue as ``text/event-stream``.

    Not Starlette's StreamingResponse: that awaits each write with no limit, so a client
    that stops reading would hold the response (and its queue's last chunks) forever.
    Here a write that takes longer than ``WRITE_TIMEOUT`` ends the stream.
    """

    def __init__(self, hub: Hub, client: Client, first: bytes) -> None:
        self.hub = hub
        self.client = client
        self.first = first

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"),
                   (b"cache-control", b"no-store"),
                   (b"x-accel-buffering", b"no")]  # nginx would otherwise buffer it all
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            pump = asyncio.ensure_future(self._pump(send))
            watch = asyncio.ensure_future(self._watch(receive))
            try:
                done, _ = await asyncio.wait({pump, watch},
                                             return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (pump, watch):
                    task.cancel()
                for task in (pump, watch):
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
            if watch not in done:
                # We end the stream (dropped or shutting down): finish the response if
                # the client takes it, else return and let the server close the socket.
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(1.0):
                        await send({"type": "http.response.body", "body": b"",
                                    "more_body": False})
        finally:
            self.hub.unsubscribe(self.client)

    async def _pump(self, send: Any) -> None:
        chunk: bytes | None = b"retry: %d\n" % RETRY_MS + self.first
        while chunk is not None:
            try:
                async with asyncio.timeout(WRITE_TIMEOUT):
                    await send({"type": "http.response.body", "body": chunk,
                                "more_body": True})
            except TimeoutError:
                logger.warning("dropped an event-stream client (%s) that stopped reading",
                               self.client.peer)
                self.hub.dropped_total += 1
                return
            try:
                async with asyncio.timeout(KEEPALIVE):
                    chunk = await self.client.queue.get()
            except TimeoutError:
                chunk = b": keepalive\n\n"

    @staticmethod
    async def _watch(receive: Any) -> None:
        while True:
            message: Message = await receive()
            if message.get("type") == "http.disconnect":
                return
