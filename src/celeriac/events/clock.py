"""The Lamport clock that orders events from one sender (and from senders that talk).

Wall clocks on different machines disagree; a logical clock does not need them to agree.
Rules (Lamport, 1978): a sender moves its clock forward by one for every event it sends
and stamps the event with the new value; a receiver sets its clock to
``max(own, received) + 1``, so anything it sends afterwards is ordered after what it saw.
"""

from __future__ import annotations

import os
import threading
import weakref

_clocks: weakref.WeakSet[LamportClock] = weakref.WeakSet()


class LamportClock:
    """A thread-safe Lamport clock: ``forward()`` on send, ``adjust(other)`` on receive."""

    __slots__ = ("__weakref__", "_lock", "_value")

    def __init__(self, initial: int = 0) -> None:
        self._value = initial
        self._lock = threading.Lock()
        _clocks.add(self)

    @property
    def value(self) -> int:
        return self._value

    def forward(self) -> int:
        """Advance for an event being sent; returns the value to stamp it with."""
        with self._lock:
            self._value += 1
            return self._value

    def reserve(self, n: int) -> int:
        """Advance by ``n`` for ``n`` events sent in order; returns the value before: they
        are stamped with the next ``n`` values."""
        with self._lock:
            value = self._value
            self._value = value + n
            return value

    def adjust(self, other: int) -> int:
        """Take in the clock of a received event; returns the new value."""
        with self._lock:
            self._value = max(self._value, other) + 1
            return self._value

    def __repr__(self) -> str:
        return f"<LamportClock {self._value}>"


def _reset_locks_in_child() -> None:
    # A thread of the parent may have held a clock's lock at the instant of fork(); in the
    # child that thread does not exist and would never release it.
    for clock in list(_clocks):
        clock._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_locks_in_child)
