"""``EventReceiver``: subscribes to the events channel and hands events to handlers.

Broadcasts are "from now on": ``open()`` returns once the subscription is live, and
what was sent before is gone. When the subscription breaks (the broker restarted),
``get()`` subscribes again with backoff, inside the caller's timeout; what was broadcast
meanwhile is lost, which monitors tolerate (the next heartbeat brings a worker back).

A payload may hold thousands of events (a batch, or a burst anyone with access to the
broker can send). ``get()`` returns them one by one, checking each as it goes, and lets
the loop turn once ``SLICE`` seconds have passed since it last did: the receiver shares
its loop (a worker's pump, control, timers), and a ``get()`` served from what was
already read would otherwise never suspend.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING

import orjson

from ..transports.base import Subscription, Transport, create_transport
from .clock import LamportClock
from .dispatcher import BACKOFF_FIRST, BACKOFF_MAX, EVENTS_CHANNEL, Event

if TYPE_CHECKING:
    from ..app import Celeriac

logger = logging.getLogger("celeriac.events.receiver")

Handler = Callable[[Event], None]
_POLL = 0.5  # how often acapture() looks at should_stop while nothing arrives
SLICE = 0.005
"""Seconds of receiving and handling events after which ``get()`` lets the loop turn."""


class EventReceiver:
    """Receives events; ``handlers`` maps event types (or ``"*"``: every type without a
    handler of its own) to callables. Use ``async with`` / ``acapture`` on a loop, or
    the blocking ``capture``. ``transport``: use this one (its owner closes it)."""

    def __init__(self, app: Celeriac, handlers: Mapping[str, Handler] | None = None, *,
                 clock: LamportClock | None = None, transport: Transport | None = None
                 ) -> None:
        self.app = app
        self.handlers: dict[str, Handler] = dict(handlers or {})
        self.clock = clock if clock is not None else LamportClock()
        self._own_transport = transport is None
        self.transport = transport if transport is not None else create_transport(
            app.settings.broker_url, app.settings)
        self.should_stop = False
        """Set it (from a handler, or another task) and ``acapture`` returns soon after."""
        self.malformed = 0
        self._sub: Subscription | None = None
        self._opened = False
        self._ready: deque[object] = deque()  # decoded, not yet checked
        self._received = 0.0  # when the payload in _ready arrived
        self._warned = False  # about a malformed event of that payload
        self._turn_at = 0.0  # when get() next lets the loop turn

    # -- subscription -------------------------------------------------------------------
    async def open(self) -> None:
        """Subscribe; events broadcast after this returns are received."""
        if self._sub is None:
            self._sub = await self.transport.subscribe(EVENTS_CHANNEL)
        self._opened = True

    async def close(self) -> None:
        self._opened = False
        sub, self._sub = self._sub, None
        if sub is not None:
            await _quietly_close(sub)
        if self._own_transport:
            self.transport.close()

    async def __aenter__(self) -> EventReceiver:
        await self.open()
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # -- receiving ------------------------------------------------------------------------
    async def get(self, timeout: float) -> Event | None:
        """The next event (clock adjusted, ``local_received`` set), or None after
        ``timeout`` seconds without one."""
        if time.monotonic() >= self._turn_at:
            await asyncio.sleep(0)
            self._turn_at = time.monotonic() + SLICE
        event = self._next()
        if event is not None:
            return event
        if not self._opened:
            raise RuntimeError("EventReceiver.get() before open()")
        return await self._receive(time.monotonic() + timeout)

    async def _receive(self, deadline: float) -> Event | None:
        """The next event of the payloads read from the subscription until ``deadline``
        (monotonic); a broken subscription is made again, with backoff."""
        attempt = 0
        while True:
            remaining = max(deadline - time.monotonic(), 0.0)
            try:
                payload = await self._read(remaining)
            except Exception as exc:  # any client error: the subscription is gone
                await self._drop(exc, first=attempt == 0)
                delay = min(BACKOFF_FIRST * 2 ** attempt, BACKOFF_MAX, remaining)
                attempt += 1
                if delay <= 0:
                    return None
                await asyncio.sleep(delay)
                continue
            if payload is None:
                return None
            self._load(payload)
            event = self._next()
            if event is not None or remaining <= 0:
                return event

    async def _read(self, timeout: float) -> bytes | None:
        """The next payload, subscribing first if the subscription was lost."""
        if self._sub is None:
            self._sub = await self.transport.subscribe(EVENTS_CHANNEL)
            logger.info("events: subscribed again")
        return await self._sub.get(timeout)

    async def _drop(self, exc: Exception, *, first: bool) -> None:
        """Forget the broken subscription (logged at the first failure of a ``get``)."""
        if first:
            logger.warning("events: subscription lost (%s); subscribing again", exc)
        sub, self._sub = self._sub, None
        if sub is not None:
            await _quietly_close(sub)

    def _load(self, payload: bytes) -> None:
        try:
            data = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            self.malformed += 1
            logger.warning("events: ignoring a payload that is not JSON (%s): %.80r", exc,
                           payload)
            return
        if isinstance(data, list):
            self._ready.extend(data)
        else:
            self._ready.append(data)
        self._received = time.time()
        self._warned = False

    def _next(self) -> Event | None:
        """The next well-formed event of the payload read, clock adjusted."""
        ready = self._ready
        while ready:
            item = ready.popleft()
            if not isinstance(item, dict) or not isinstance(item.get("type"), str):
                self.malformed += 1
                if not self._warned:  # one line per payload, however bad it is
                    self._warned = True
                    logger.warning("events: ignoring a malformed event: %.80r", item)
                continue
            clock = item.get("clock")
            if isinstance(clock, int):
                self.clock.adjust(clock)
            item["local_received"] = self._received
            return item
        return None

    def process(self, event: Event) -> None:
        """Hand ``event`` to its handler; a failing handler is logged, not raised, so one
        bad event does not end a monitor."""
        handler = self.handlers.get(event["type"]) or self.handlers.get("*")
        if handler is None:
            return
        try:
            handler(event)
        except Exception:
            logger.exception("events: handler for %s failed", event["type"])

    async def acapture(self, limit: int | None = None, timeout: float | None = None) -> int:
        """Handle events until ``limit`` of them, ``timeout`` seconds, or ``should_stop``;
        returns how many were handled. Opens the subscription if needed (and leaves it
        open)."""
        await self.open()
        deadline = None if timeout is None else time.monotonic() + timeout
        count = 0
        while (limit is None or count < limit) and not self.should_stop:
            wait = _POLL if deadline is None else min(_POLL, deadline - time.monotonic())
            if wait <= 0:
                break
            event = await self.get(wait)
            if event is not None:
                self.process(event)
                count += 1
        return count

    def capture(self, limit: int | None = None, timeout: float | None = None) -> int:
        """``acapture`` on an event loop of its own; subscribes, and closes when done."""
        async def run() -> int:
            async with self:
                return await self.acapture(limit, timeout)

        return asyncio.run(run())


async def _quietly_close(sub: Subscription) -> None:
    with contextlib.suppress(Exception):
        await sub.close()

