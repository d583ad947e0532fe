"""Flow control on Redis (``flow.FlowStore``): the script ``store_flow.lua``. Keys::

    <ns>:lease:<name>     string  a unique lock's holder (the lease layout); PX its life
    <ns>:slots:<name>     zset    holder -> expiry (ms, Redis's clock); PEXPIRE its last
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from .flow import FlowStore, check_slot_args

if TYPE_CHECKING:
    import redis

    from ..clients.redis.connector import Connector


def _ms(ttl: float) -> int:
    return max(1, round(ttl * 1000))


class RedisFlow(FlowStore):
    """Mixed into ``RedisStore``, whose ``_run`` runs a ``store_*`` script and ``conn``
    any command."""

    conn: Connector

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        raise NotImplementedError  # RedisStore's

    def _call(self, op: Any) -> Any:
        return self.conn.call(op)

    def hold(self, name: str, owner: str, ttl: float) -> str | None:
        held = self._run("flow", [f"lease:{name}"], ["hold", owner, _ms(ttl)])
        return held.decode() if held else None

    def swap(self, name: str, owner: str, ttl: float) -> str | None:
        held = self._run("flow", [f"lease:{name}"], ["swap", owner, _ms(ttl)])
        return held.decode() if held else None

    def slot_take(self, name: str, holder: str, limit: int, ttl: float) -> bool:
        check_slot_args(limit, ttl)
        return int(self._run("flow", [f"slots:{name}"],
                             ["take", holder, limit, _ms(ttl)])) == 1

    def slot_release(self, name: str, holder: str) -> None:
        self._call(lambda client, ns: client.zrem(f"{ns}:slots:{name}", holder))

    def slot_renew(self, name: str, holders: Sequence[str], ttl: float) -> int:
        if not holders:
            return 0
        return int(self._run("flow", [f"slots:{name}"], ["renew", _ms(ttl), *holders]))

    def slot_holders(self, name: str) -> list[str]:
        def read(client: redis.Redis, ns: str) -> list[bytes]:
            secs, micros = client.time()
            now_ms = secs * 1000 + micros // 1000
            return cast("list[bytes]", client.zrangebyscore(f"{ns}:slots:{name}",
                                                             f"({now_ms}", "+inf"))

        return sorted(h.decode() for h in self._call(read))


__all__ = ["RedisFlow"]
