"""Group commit of concurrent publishes: many threads of one process calling ``delay()``
at once share broker round trips.

A caller that finds no publish of its publisher on the wire sends its message alone, at
once (a lone thread pays nothing but a lock). A caller that finds one on the wire queues
its message and sleeps; when that round trip is confirmed, the first queued caller wakes
as the next leader and sends everything queued meanwhile in one ``publish_many`` (one
Lua script on Redis, one batch of publisher confirms on RabbitMQ, one transaction on
SQLite). Each caller returns only when the round trip that carried its message was
confirmed: nothing is acknowledged that the broker has not stored.

Errors. A failure of the round trip (the broker unreachable after the connector's
retries, a lost reply) reaches every caller whose message it carried, and no other.
Any other failure (a reply error that one message may have caused) makes each caller of
that batch publish its own message alone, so that a bad message fails its own caller
only; a message that the failed batch had stored after all is then sent twice
(delivery is at least once).
"""

from __future__ import annotations

import copy
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Final

from ..errors import BrokerLost, BrokerUnavailable, OperationalError
from ..transports.base import Outgoing, Publisher, Transport

Flush = Callable[[Sequence[Outgoing]], None]

_ALONE: Final = "alone"
"""A follower's outcome: publish your own message by yourself (see the module's header)."""
_LEAD: Final = "lead"
"""A follower's outcome: you lead the next round trip."""
MAX_BATCH = 1000
"""Messages per round trip at most: the rest wait for the next one."""


class _Slot:
    """One queued caller: its messages, the lock it sleeps on, and its outcome."""

    __slots__ = ("items", "outcome", "waiter")

    def __init__(self, items: Sequence[Outgoing]) -> None:
        self.items = items
        self.outcome: BaseException | str | None = None
        """None: stored; an exception: raise it; ``_ALONE`` or ``_LEAD``."""
        self.waiter = threading.Lock()
        self.waiter.acquire()  # released once, by whoever settles this slot

    def settle(self, outcome: BaseException | str | None) -> None:
        self.outcome = outcome
        self.waiter.release()


class GroupCommit:
    """The group commit of one publisher in one process (``for_publisher``)."""

    def __init__(self, flush: Flush,
                 crowded: Callable[[], AbstractContextManager[None]] | None = None) -> None:
        self.flush = flush
        self.crowded = crowded
        """Around a round trip that others wait on: the publisher's way of waiting for
        its reply without a busy wait (``Connector.crowded`` on Redis)."""
        self._was_crowded = False
        self._lock = threading.Lock()
        self._busy = False
        """A leader is publishing: callers queue."""
        self._queue: deque[_Slot] = deque()
        self.round_trips = 0
        self.messages = 0
        """Counters (tests and the bench read them): round trips made, messages carried."""

    def publish(self, items: Sequence[Outgoing]) -> None:
        """Publish ``items`` (one caller's); returns once the broker has stored them."""
        lock = self._lock
        lock.acquire()
        if not self._busy:
            self._busy = True
            lock.release()
            if self._queue or self._was_crowded:
                self._lead(items)
                return
            # Alone on the wire (the common case: one thread), inline: _lead with
            # nothing queued. Whoever queues meanwhile is woken by the hand-off.
            try:
                self.flush(items)
                self.round_trips += 1
                self.messages += len(items)
            finally:
                lock.acquire()
                if self._queue:
                    self._queue.popleft().settle(_LEAD)
                else:
                    self._busy = False
                lock.release()
            return
        slot = _Slot(items)
        self._queue.append(slot)
        lock.release()
        outcome = self._wait(slot)
        if outcome is None:
            return
        if outcome == _LEAD:
            self._lead(items)
        elif outcome == _ALONE:
            self.flush(items)
        else:
            assert isinstance(outcome, BaseException)
            raise _own(outcome)

    def _wait(self, slot: _Slot) -> BaseException | str | None:
        try:
            slot.waiter.acquire()
        except BaseException:
            # Interrupted (KeyboardInterrupt in the main thread) while queued: take the
            # message back if no leader has taken it yet; if one has, wait for the
            # outcome so that the leadership handed to us is never lost.
            with self._lock:
                if slot in self._queue:
                    self._queue.remove(slot)
                    raise
            slot.waiter.acquire()
            if slot.outcome == _LEAD:
                self._hand_off()
            raise
        return slot.outcome

    def _lead(self, items: Sequence[Outgoing]) -> None:
        """Send ``items`` (ours) with everything queued, then hand the lead on and
        settle the callers whose messages went with ours."""
        taken: list[_Slot] = []
        batch = items
        # Unlocked, a caller that queues just after this look waits for our _hand_off
        # and leads the next round trip: the same as if it had come after the lock.
        if self._queue:
            with self._lock:
                size = len(items)
                while self._queue and size < MAX_BATCH:
                    taken.append(self._queue.popleft())
                    size += len(taken[-1].items)
            batch = list(items)
            for slot in taken:
                batch.extend(slot.items)
        error: BaseException | None = None
        # Crowded now, or in the last round trip (its callers will be back at once).
        crowded, self._was_crowded = bool(taken) or self._was_crowded, bool(taken)
        try:
            if crowded and self.crowded is not None:
                with self.crowded():
                    self.flush(batch)
            else:
                self.flush(batch)
            self.round_trips += 1
            self.messages += len(batch)
        except BaseException as exc:
            error = exc
        finally:
            # The next round trip starts before this one's callers wake: it carries
            # whatever gathered while this one was on the wire.
            self._hand_off()
            outcome = _outcome(error) if taken else None
            for slot in taken:
                slot.settle(outcome)
        if error is None:
            return
        if taken and outcome == _ALONE:
            self.flush(items)
            return
        raise error

    def _hand_off(self) -> None:
        with self._lock:
            if self._queue:
                self._queue.popleft().settle(_LEAD)
            else:
                self._busy = False


def _outcome(error: BaseException | None) -> BaseException | str | None:
    """What the callers of a batch that raised ``error`` get (the module's header)."""
    if error is None:
        return None
    if isinstance(error, BrokerUnavailable | BrokerLost):
        return error  # the round trip failed, for every message in it alike
    if not isinstance(error, Exception):
        # The leader was interrupted mid-round-trip: whether the batch was stored is
        # unknown to everyone in it.
        return OperationalError(
            f"the publish carrying this message was interrupted ({type(error).__name__}); "
            "it may or may not have been stored")
    return _ALONE


def _own(error: BaseException) -> BaseException:
    """A copy of ``error`` for one caller (each thread raises its own: tracebacks are
    written into the exception), chained to the original."""
    try:
        mine = copy.copy(error)
    except Exception:  # an exception type that cannot be copied: share it
        return error
    mine.__cause__, mine.__traceback__ = error, None
    return mine


_ATTRIBUTE = "_celeriac_group_commit"
"""Where a publisher keeps ``(pid, its GroupCommit or False)``: one attribute read per
``delay()``, where a registry lookup cost a weak reference."""
_lock = threading.Lock()
_lock_pid = os.getpid()


def for_publisher(publisher: Publisher) -> GroupCommit | None:
    """``publisher``'s group commit in this process (made on first use; a forked child
    starts afresh: a leader of the parent's would never wake its queue here). None for
    a publisher that is not a broker's (an outbox, a pool child's relay) or lives in
    this process's memory: there is no round trip to share."""
    global _lock, _lock_pid
    pid = os.getpid()
    found = getattr(publisher, _ATTRIBUTE, None)
    if found is None or found[0] != pid:
        if _lock_pid != pid:  # forked while another thread held it: a fresh one
            _lock, _lock_pid = threading.Lock(), pid
        with _lock:
            found = getattr(publisher, _ATTRIBUTE, None)
            if found is None or found[0] != pid:
                found = (pid, _make(publisher))
                setattr(publisher, _ATTRIBUTE, found)
    group = found[1]
    return group if isinstance(group, GroupCommit) else None


def _make(publisher: Publisher) -> GroupCommit | bool:
    if not isinstance(publisher, Transport) or publisher.process_local:
        return False
    # A Redis transport's connector waits for replies without spinning when asked to
    # (duck-typed: this layer names no broker).
    crowded = getattr(getattr(publisher, "conn", None), "crowded", None)
    return GroupCommit(publisher.publish_many, crowded)
