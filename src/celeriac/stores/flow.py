"""Flow control's part of the shared store: unique jobs' locks and concurrency slots.

Both are leases that end with a message's life, and each operation is atomic in the
store, one round trip:

- **unique locks** are named leases (the same names and rows as ``acquire``/``release``
  /``lease``, so ``release(name, task_id)`` drops one only for the task holding it).
  ``hold`` takes a lock or says who holds it; ``swap`` takes it whoever holds it and says
  who did (debounce: the last call wins). ``producer/unique.py`` takes them,
  ``worker/limits.py`` lets them go.
- **concurrency slots** are a counting semaphore per name: ``slot_take`` gives
  ``holder`` a slot if fewer than ``limit`` live ones are held, each slot a lease of its
  own that its worker renews (``slot_renew``) with its message lease, so a dead
  worker's slots lapse within ``worker_lease_timeout``. ``worker/limits.py`` holds them.

One implementation per store, each in a module of its own (``redis_flow``,
``postgres_flow``, ``sqlite_flow``, ``memory_flow``), mixed into the store's class;
``tests/contracts/test_flow_store.py`` runs one suite against all of them.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

SLOT_SEPARATOR = "#"
"""Between a semaphore's name and a holder, where slots are lease rows (SQL stores)."""


def check_slot_args(limit: int, ttl: float) -> None:
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError(f"limit must be an int >= 1, got {limit!r}")
    if not ttl > 0:
        raise ValueError(f"ttl must be > 0 seconds, got {ttl!r}")


class FlowStore(abc.ABC):
    """The operations; see the module's docstring."""

    @abc.abstractmethod
    def hold(self, name: str, owner: str, ttl: float) -> str | None:
        """Take lease ``name`` for ``ttl`` seconds if it is free or lapsed (renew it if
        ``owner`` holds it): None when ``owner`` holds it now, else its holder."""

    @abc.abstractmethod
    def swap(self, name: str, owner: str, ttl: float) -> str | None:
        """Make ``owner`` the holder of lease ``name`` for ``ttl`` seconds, whoever held
        it; returns the previous live holder (None: none, or ``owner`` itself)."""

    @abc.abstractmethod
    def slot_take(self, name: str, holder: str, limit: int, ttl: float) -> bool:
        """A slot of semaphore ``name`` for ``holder`` for ``ttl`` seconds, if fewer than
        ``limit`` live slots are held (or ``holder`` has one already: renewed)."""

    @abc.abstractmethod
    def slot_release(self, name: str, holder: str) -> None:
        """Give ``holder``'s slot back (nothing if it has none)."""

    @abc.abstractmethod
    def slot_renew(self, name: str, holders: Sequence[str], ttl: float) -> int:
        """Extend the live slots of ``holders`` to ``ttl`` from now; how many were held
        (a lapsed slot is not taken again)."""

    @abc.abstractmethod
    def slot_holders(self, name: str) -> list[str]:
        """The holders of live slots of semaphore ``name``."""


__all__ = ["SLOT_SEPARATOR", "FlowStore", "check_slot_args"]
