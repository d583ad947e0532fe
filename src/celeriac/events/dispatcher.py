"""``EventDispatcher``: stamps events and broadcasts them from a sender thread.

The worker's main process queues every task event on its event loop, between the
steps that move tasks along, so queueing does as little as can be: ``put_many()`` appends
dicts that hold their ``type`` and ``timestamp`` to a deque under one lock and at most
notifies a condition (``put()`` is that for one event; ``send()`` builds the dict from
keywords first). Everything else happens in a daemon thread, which owns the broker
connection: it stamps each event with ``hostname``, ``pid``, ``utcoffset`` and the
Lamport ``clock`` as it takes it from the queue (one thread, in queue order: clock order
is send order), encodes, and sends. Why there: the loop's time per task is what bounds a
worker's throughput, and the thread mostly runs while the loop waits on its sockets.

- events of the *buffered* groups (``task`` by default) leave in batches, when
  ``events_buffer_limit`` of them wait or ``events_flush_interval`` after the first one
  arrived, whichever comes first; an event of another group (``worker-heartbeat``) wakes
  the thread at once and takes whatever waits before it along, so order is kept;
- a batch is one ``transport.broadcast(EVENTS_CHANNEL, payload, routing_key)``: the
  payload is a JSON array of events of one group, the routing key the event's type
  with dots (``task.succeeded``) or, for several, ``<group>.multi``, as Celery's.
  Where the broker can tell that nobody subscribed (Redis pub/sub:
  ``transport.has_subscribers``) the batch is not made at all and counts
  in ``unheard``: the broker would drop it, so events cost a worker nearly nothing while
  no monitor watches;
- while the broker is unreachable, events wait, at most ``events_offline_buffer`` of
  them: beyond it the oldest go first and are counted in ``dropped``. The thread retries
  with exponential backoff (capped at 2 s) on a transport of its own made with
  ``broker_connection_retry=False``, so an outage shows within one connection attempt,
  and the transport's own retry loop never sleeps while events pile up.

Hiding task arguments (``events_hide_args``) is the caller's job: the code that builds
a ``task-received`` / ``task-sent`` event (the worker's consumer, ``app.send_task``)
leaves ``args`` and ``kwargs`` out. The dispatcher sends whatever fields it is given.

After ``fork()`` the child has no sender thread: its copies of the dispatchers are
disabled, with fresh locks, so nothing the parent's thread held can block the child
(``forking`` also makes a fork wait for the sender to leave its broker client). Code in
a child that wants to send events makes a dispatcher of its own.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import orjson

from ..transports.base import EVENTS_CHANNEL as EVENTS_CHANNEL
from ..transports.base import Transport, create_transport
from . import forking
from .clock import LamportClock

if TYPE_CHECKING:
    from ..app import Celeriac

Event = dict[str, Any]

logger = logging.getLogger("celeriac.events.dispatcher")

BACKOFF_FIRST = 0.05
BACKOFF_MAX = 2.0
_UTCOFFSET_EVERY = 60.0

_OFF, _BUFFERED, _NOW = 0, 1, 2


def utcoffset() -> int:
    """Hours west of UTC, as Celery computes it (its monitors undo it with this sign)."""
    if time.localtime().tm_isdst:
        return time.altzone // 3600
    return time.timezone // 3600


def default_hostname() -> str:
    return f"celeriac@{socket.gethostname()}"


def group_of(type_: str) -> str:
    return type_.partition("-")[0]


def routing_key(type_: str, count: int = 1) -> str:
    """Celery's routing key for ``count`` events of ``type_``'s group: the type with
    dots, or ``<group>.multi`` for a batch of several."""
    return f"{group_of(type_)}.multi" if count > 1 else type_.replace("-", ".")


class EventDispatcher:
    """Sends events to every ``EventReceiver`` of the app's broker; see the module doc.

    ``groups``: the groups sent (``None``: all); ``buffer_groups``: those sent in
    batches; both may be changed later. ``transport``: use this one (its owner closes
    it) instead of making one. ``hold``: queue events but start no sender (no thread, no
    connection) until ``release()`` (or ``close()``): a starting worker's, whose
    ``worker-online`` then leaves once its first tasks are dispatched.
    """

    def __init__(self, app: Celeriac, *, hostname: str | None = None,
                 groups: Iterable[str] | None = None,
                 buffer_groups: Iterable[str] = ("task",), enabled: bool = True,
                 transport: Transport | None = None, hold: bool = False) -> None:
        settings = app.settings
        self.app = app
        self.hostname = hostname or default_hostname()
        self._kinds: dict[str, int] = {}  # event type -> _OFF / _BUFFERED / _NOW
        self.groups = groups
        self.buffer_groups = buffer_groups
        self.enabled = enabled
        self.pid = os.getpid()
        self.dropped = 0
        """Events lost: pushed out of the offline buffer, or unsendable."""
        self.sent = 0
        """Events that left: the broker accepted them, or nobody listened (``unheard``)."""
        self.unheard = 0
        """Events not sent because the broker said nobody subscribed (Redis): it would
        have dropped them."""
        self.buffer_limit = settings.events_buffer_limit
        self.flush_interval = settings.events_flush_interval
        self.offline_limit = settings.events_offline_buffer
        self._own_transport = transport is None
        self.transport = transport if transport is not None else create_transport(
            settings.broker_url, settings.replace(broker_connection_retry=False))
        self._utcoffset = utcoffset()
        self._pending: deque[Event] = deque()
        self._in_flight = 0
        self._urgent = False
        self._flushers = 0
        self._closing = False
        self._close_deadline = 0.0
        self._due: float | None = None  # when the oldest waiting event must go (sender's)
        self._dead = False  # a forked child's copy
        self._thread: threading.Thread | None = None
        self._holding = hold
        self._new_locks()
        self.clock = LamportClock()
        forking.register(self)
        if enabled:
            with self._lock:
                self._start()

    def _after_fork_in_child(self) -> None:
        """This copy in a forked child: disabled, with fresh locks and nothing queued."""
        self._new_locks()
        self._dead = True
        self.enabled = False
        self._thread = None
        self._pending = deque()
        self._in_flight = 0

    def _new_locks(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)   # the sender waits on it
        self._idle = threading.Condition(self._lock)   # flush() waits on it
        self._stop = threading.Event()                  # cuts a backoff sleep short

    def release(self) -> None:
        """Start sending (``hold``): the sender thread starts, with what was queued."""
        with self._lock:
            self._holding = False
            if self.enabled:
                self._start()

    def _start(self) -> None:
        if self._thread is None and not self._dead and not self._closing \
                and not self._holding:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name=f"celeriac-events-{self.hostname}")
            self._thread.start()

    def __repr__(self) -> str:
        return f"<EventDispatcher {self.hostname} pending={len(self._pending)}>"

    # -- the caller's side --------------------------------------------------------------
    @property
    def groups(self) -> frozenset[str] | None:
        """The groups sent (None, or empty as in Celery: all of them)."""
        return self._groups

    @groups.setter
    def groups(self, groups: Iterable[str] | None) -> None:
        self._groups = frozenset(groups) if groups else None
        self._kinds = {}

    @property
    def buffer_groups(self) -> frozenset[str]:
        """The groups sent in batches."""
        return self._buffer_groups

    @buffer_groups.setter
    def buffer_groups(self, groups: Iterable[str]) -> None:
        self._buffer_groups = frozenset(groups)
        self._kinds = {}

    def enabled_for(self, type: str) -> bool:
        return self.enabled and self._kind(type) != _OFF

    def send(self, type: str, **fields: Any) -> Event | None:
        """Queue one event; returns it, or None when the dispatcher or the event's group is
        disabled. Never blocks on the broker. The event is stamped with ``hostname``,
        ``pid``, ``utcoffset`` and ``clock`` as it leaves: do not change it afterwards."""
        fields["type"] = type
        fields["timestamp"] = time.time()
        return fields if self.put(fields) else None

    def put(self, event: Event) -> bool:
        """``send()`` for an event that holds its ``type`` and ``timestamp`` already.
        False when the dispatcher or the event's group is disabled."""
        return self.put_many((event,)) == 1

    def put_many(self, events: Iterable[Event]) -> int:
        """``put()`` for several events, in order, under one lock (the worker's loop hands
        over what one turn of its consumer made); returns how many were queued."""
        if not self.enabled:
            return 0
        kinds = self._kinds
        accepted: list[Event] = []
        urgent = False
        for event in events:
            type_ = event["type"]
            kind = kinds.get(type_)
            if kind is None:
                kind = kinds[type_] = self._kind(type_)
            if kind != _OFF:
                accepted.append(event)
                urgent = urgent or kind == _NOW
        if not accepted:
            return 0
        with self._lock:
            if self._closing:
                return 0
            pending = self._pending
            n = len(pending)
            pending.extend(accepted)
            over = len(pending) - self.offline_limit
            if over > 0:  # the oldest go first
                for _ in range(over):
                    pending.popleft()
                self.dropped += over
            limit = self.buffer_limit
            if urgent:
                self._urgent = True
                self._wake.notify()
            elif n == 0 or n // limit != len(pending) // limit:
                self._wake.notify()  # start the flush timer, or a batch is full
            if self._thread is None:
                self._start()
        return len(accepted)

    def _kind(self, type: str) -> int:
        group = group_of(type)
        if self._groups is not None and group not in self._groups:
            return _OFF
        return _BUFFERED if group in self._buffer_groups else _NOW

    def flush(self, timeout: float | None = None) -> bool:
        """Send everything queued now; True once the broker has it all, False if
        ``timeout`` passed first (the broker is down: events stay queued)."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                return not self._pending
            self._flushers += 1
            self._wake.notify()
            try:
                return self._idle.wait_for(
                    lambda: not self._pending and not self._in_flight, timeout)
            finally:
                self._flushers -= 1

    def close(self, timeout: float = 2.0) -> None:
        """Send what is queued (for up to ``timeout`` s), stop the thread, close the
        transport if it is ours. Later ``send()`` calls return None."""
        if self._holding:
            self.release()  # what was held goes now
        with self._lock:
            if self._closing:
                return
            self._closing = True
            self._close_deadline = time.monotonic() + timeout
            self._wake.notify()
            thread = self._thread
        self._stop.set()  # a sender in a backoff sleep tries once more now
        if thread is None:
            self._close_transport()
            return
        thread.join(timeout + 0.5)
        if thread.is_alive():  # stuck in a network call: it closes the transport itself
            logger.warning("event sender of %s did not stop within %.1fs", self.hostname,
                           timeout)

    def _close_transport(self) -> None:
        if self._own_transport and not self._dead:
            try:
                with forking.io_lock():
                    self.transport.close()
            except Exception as exc:
                logger.debug("closing the events transport: %s", exc)

    # -- the sender thread ----------------------------------------------------------------
    def _run(self) -> None:
        outage_since: float | None = None
        dropped_before = 0  # the count at the last success: drops since then are reported
        attempt = 0
        offset_at = time.monotonic()
        try:
            while True:
                batch = self._next_batch()
                if batch is None:
                    return
                if time.monotonic() - offset_at > _UTCOFFSET_EVERY:  # DST changes
                    self._utcoffset, offset_at = utcoffset(), time.monotonic()
                done, error = self._broadcast(batch)
                self._settle(batch, done)
                if error is None:
                    if outage_since is None:
                        dropped_before = self.dropped
                    else:
                        logger.info("events: broker reachable again after %.1fs; sending %d "
                                    "held events (%d dropped)", time.monotonic() - outage_since,
                                    done + len(self._pending), self.dropped - dropped_before)
                        outage_since, attempt, dropped_before = None, 0, self.dropped
                    continue
                if outage_since is None:
                    outage_since = time.monotonic()
                    logger.warning("events: cannot reach the broker (%s); holding up to %d "
                                   "events", error, self.offline_limit)
                delay = min(BACKOFF_FIRST * 2 ** attempt, BACKOFF_MAX)
                attempt += 1
                if self._closing:
                    if time.monotonic() + delay > self._close_deadline:
                        self._give_up()
                        return
                    time.sleep(delay)  # _stop is set for good now: it would not wait
                else:
                    self._stop.wait(delay)
        except Exception:  # a bug here must not pass silently: events would just stop
            logger.exception("event sender of %s failed", self.hostname)
        finally:
            self._close_transport()

    def _next_batch(self) -> list[Event] | None:
        """Wait until a batch is due and take it; None once closing with nothing left.

        Due: everything at once when urgent (an unbuffered event, flush, close) or when
        the oldest waiting event has waited ``flush_interval``; before that, only whole
        batches of ``buffer_limit`` (the rest keeps waiting for its interval)."""
        cap = self.buffer_limit * 10  # bounds the time the lock is held to pop
        with self._lock:
            while True:
                n = len(self._pending)
                if not n:
                    if self._closing:
                        return None
                    self._due = None
                    self._wake.wait()
                    continue
                now = time.monotonic()
                if self._due is None:
                    self._due = now + self.flush_interval
                if self._urgent or self._flushers or self._closing or now >= self._due:
                    take = min(n, cap)
                    break
                if n >= self.buffer_limit:
                    take = min(n - n % self.buffer_limit, cap)
                    break
                self._wake.wait(self._due - now)
            self._urgent = False
            if take == n:
                self._due = None
            batch = [self._pending.popleft() for _ in range(take)]
            self._in_flight = take
            return batch

    def _stamp(self, batch: list[Event]) -> None:
        """Add the sender's fields and the clock to the events that have none yet (a
        batch that failed comes back stamped: its clocks stay)."""
        fresh = [e for e in batch if "clock" not in e]
        if not fresh:
            return
        value = self.clock.reserve(len(fresh))
        hostname, pid, offset = self.hostname, self.pid, self._utcoffset
        for event in fresh:
            value += 1
            event["hostname"] = hostname
            event["pid"] = pid
            event["utcoffset"] = offset
            event["clock"] = value

    def _broadcast(self, batch: list[Event]) -> tuple[int, Exception | None]:
        """Send ``batch`` as payloads of one group each; returns how many events went,
        and the error that stopped it."""
        try:
            with forking.io_lock():
                heard = self.transport.has_subscribers(EVENTS_CHANNEL)
        except Exception as exc:  # as for broadcast() below
            return 0, exc
        if not heard:  # spare the encoding and the bytes the broker would drop
            with self._lock:
                self.unheard += len(batch)
            return len(batch), None
        self._stamp(batch)
        start = 0
        while start < len(batch):
            group = group_of(batch[start]["type"])
            end = start + 1
            limit = min(len(batch), start + self.buffer_limit)
            while end < limit and group_of(batch[end]["type"]) == group:
                end += 1
            payload = self._encode(batch[start:end])
            if payload is not None:
                try:
                    with forking.io_lock():
                        self.transport.broadcast(EVENTS_CHANNEL, payload, routing_key(
                            batch[start]["type"], end - start))
                except Exception as exc:  # whatever the client raises: an outage to wait out
                    return start, exc
            start = end
        return start, None

    def _encode(self, events: list[Event]) -> bytes | None:
        try:
            try:
                return orjson.dumps(events, default=repr)
            except TypeError:  # a dict with keys that are not strings, or worse
                return orjson.dumps(events, default=repr, option=orjson.OPT_NON_STR_KEYS)
        except TypeError as exc:  # orjson.JSONEncodeError: int over 64 bits, deep nesting
            logger.error("events: dropping %d event(s) that cannot be encoded as JSON "
                         "(%s; first: %s)", len(events), exc, events[0]["type"])
            with self._lock:
                self.dropped += len(events)
            return None

    def _settle(self, batch: list[Event], done: int) -> None:
        with self._lock:
            self.sent += done
            if done < len(batch):  # back in front, in order; then trim to the limit
                self._pending.extendleft(reversed(batch[done:]))
                self._urgent = True  # due again right after the backoff, not an interval later
                while len(self._pending) > self.offline_limit:
                    self._pending.popleft()
                    self.dropped += 1
            self._in_flight = 0
            if not self._pending:
                self._idle.notify_all()

    def _give_up(self) -> None:
        with self._lock:
            lost = len(self._pending)
            self._pending.clear()
            self.dropped += lost
            self._idle.notify_all()
        logger.warning("events: %d event(s) not sent: the broker was unreachable at close",
                       lost)
