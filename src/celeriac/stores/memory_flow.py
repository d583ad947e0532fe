"""Flow control in memory (``flow.FlowStore``), in the store's lease dict under its lock:
a unique lock is a lease; a slot of semaphore ``<name>`` is the lease
``<name>#<holder>``. For tests and one process."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .base import Lease
from .flow import SLOT_SEPARATOR, FlowStore, check_slot_args


class MemoryFlow(FlowStore):
    """Mixed into ``MemoryStore`` (its state ``_s``: ``lock``, ``leases``; ``clock``)."""

    _s: Any
    clock: Callable[[], float]

    def _live(self, name: str, now: float) -> str | None:
        lease: Lease | None = self._s.leases.get(name)
        return lease.holder if lease is not None and lease.expires > now else None

    def hold(self, name: str, owner: str, ttl: float) -> str | None:
        with self._s.lock:
            now = self.clock()
            held = self._live(name, now)
            if held is not None and held != owner:
                return held
            self._s.leases[name] = Lease(owner, now + ttl)
            return None

    def swap(self, name: str, owner: str, ttl: float) -> str | None:
        with self._s.lock:
            now = self.clock()
            held = self._live(name, now)
            self._s.leases[name] = Lease(owner, now + ttl)
            return held if held != owner else None

    def _slots(self, name: str, now: float) -> list[str]:
        prefix = f"{name}{SLOT_SEPARATOR}"
        leases: dict[str, Lease] = self._s.leases
        return [k for k, v in leases.items() if k.startswith(prefix) and v.expires > now]

    def slot_take(self, name: str, holder: str, limit: int, ttl: float) -> bool:
        check_slot_args(limit, ttl)
        with self._s.lock:
            now = self.clock()
            mine = f"{name}{SLOT_SEPARATOR}{holder}"
            live = self._slots(name, now)
            if mine not in live and len(live) >= limit:
                return False
            self._s.leases[mine] = Lease(holder, now + ttl)
            return True

    def slot_release(self, name: str, holder: str) -> None:
        with self._s.lock:
            self._s.leases.pop(f"{name}{SLOT_SEPARATOR}{holder}", None)

    def slot_renew(self, name: str, holders: Sequence[str], ttl: float) -> int:
        with self._s.lock:
            now = self.clock()
            live = set(self._slots(name, now))
            held = 0
            for h in holders:
                key = f"{name}{SLOT_SEPARATOR}{h}"
                if key in live:
                    self._s.leases[key] = Lease(h, now + ttl)
                    held += 1
            return held

    def slot_holders(self, name: str) -> list[str]:
        with self._s.lock:
            now = self.clock()
            return sorted(self._s.leases[k].holder for k in self._slots(name, now))


__all__ = ["MemoryFlow"]
