"""Fork safety for the event sender threads.

A sender thread holds ``io_lock()`` around every call into a client library (SQLite,
hiredis, pika...), and ``fork()`` takes it first: a child forked while the thread was
inside the library would inherit a C-level mutex that no thread of the child will ever
release (seen: a pool child hung in ``sqlite3.connect``). So a fork waits for the sender
to leave the library, up to ``FORK_WAIT`` seconds (one connection attempt to a broker
that is down); past that it forks anyway rather than stall the worker.

In the child there is no sender thread: the lock is replaced, and every registered
sender's ``_after_fork_in_child()`` disables its copy.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Protocol

logger = logging.getLogger("celeriac.events.dispatcher")

FORK_WAIT = 5.0


class Sender(Protocol):
    def _after_fork_in_child(self) -> None: ...


_senders: weakref.WeakSet[Sender] = weakref.WeakSet()
_io_lock = threading.Lock()
_held = False


def register(sender: Sender) -> None:
    """Have ``sender._after_fork_in_child()`` called in every child forked from now on."""
    _senders.add(sender)


def io_lock() -> threading.Lock:
    """The lock a sender thread holds around each call into a broker client."""
    return _io_lock


def _before_fork() -> None:
    global _held
    _held = _io_lock.acquire(timeout=FORK_WAIT)
    if not _held:
        logger.warning("forking while the event sender is still in a broker call")


def _after_fork_in_parent() -> None:
    global _held
    if _held:
        _held = False
        _io_lock.release()


def _after_fork_in_child() -> None:
    global _io_lock, _held
    _io_lock, _held = threading.Lock(), False
    for sender in list(_senders):
        sender._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)
