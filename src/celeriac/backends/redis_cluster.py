"""Results on a Redis Cluster (``redis+cluster://``): ``redis.py``'s layout, spread by slot.

Keys are those of ``redis.py`` except the chord's::

    <ns>:r:<task_id>             string   anywhere: one key per task, any slot
    <ns>:expiring                zset     one key, so one slot
    <ns>:changes                 stream   one key, so one slot: every waiter reads one node
    {<ns>:chord:<gid>}:parts     set      the chord's two keys share a hash tag: the
    {<ns>:chord:<gid>}:fired     string   CHORD_PART script needs both in one slot

What a single server does in one round trip takes several here, in an order that keeps
the promise a waiter relies on: a batch's values are written first (a pipeline the
cluster client splits by node), then its one change entry, so a reader that sees the
entry finds the values. ``store_part`` stores the result, then counts the part (the
result is never counted before it exists). A wake-up and the read of the values are two
round trips (the values live on other nodes than the feed).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from ..redisclient.cluster import ClusterConnector
from .base import ResultBackend, Stored
from .redis import (
    _MAX_BLOCK,
    _PAGE,
    CHORD_PART,
    FEED_LENGTH,
    _pack,
    _unpack,
    _values,
    encode_value,
    expiry_ms,
)

if TYPE_CHECKING:
    from redis.cluster import RedisCluster

    from ..settings import Settings


class RedisClusterBackend(ResultBackend):
    scheme = "redis+cluster"

    def __init__(self, url: str, settings: Settings) -> None:
        super().__init__(url, settings)
        self.conn = ClusterConnector(url.split(";"), settings, "result backend",
                                     read_timeout=settings.broker_connection_timeout + _MAX_BLOCK,
                                     options=settings.result_backend_transport_options)
        self._local = threading.local()

    def store_many(self, items: Sequence[Stored]) -> None:
        if not items:
            return

        def store(client: RedisCluster, ns: str) -> None:
            now = time.time()
            pipe = client.pipeline()  # type: ignore[no-untyped-call]
            feed: dict[str, str] = {}
            for i, (task_id, content_type, data, expires_at) in enumerate(items):
                key, value = f"{ns}:r:{task_id}", encode_value(content_type, data)
                if expires_at is None:
                    pipe.set(key, value)
                    pipe.zrem(f"{ns}:expiring", task_id)
                else:
                    pipe.set(key, value, px=expiry_ms(expires_at, now))
                    pipe.zadd(f"{ns}:expiring", {task_id: expires_at})
                feed[f"t{i}"] = task_id
            pipe.execute()
            # Only once every value is written: the entry wakes the waiters.
            client.xadd(f"{ns}:changes", feed,  # type: ignore[arg-type]
                        maxlen=FEED_LENGTH, approximate=True)

        self.conn.call(store)

    def _get(self, task_ids: Sequence[str]) -> dict[str, tuple[str, bytes]]:
        if not task_ids:
            return {}

        def read(client: RedisCluster, ns: str) -> list[bytes | None]:
            keys = [f"{ns}:r:{t}" for t in task_ids]
            return cast("list[bytes | None]", client.mget_nonatomic(keys))

        return _values(task_ids, self.conn.call(read))

    # -- the change feed (as redis.py's) ----------------------------------------------------
    def _cursor(self) -> int:
        def read(client: RedisCluster, ns: str) -> list[Any]:
            return cast("list[Any]", client.xrevrange(f"{ns}:changes", count=1))

        last = self.conn.call(read)
        stream_id = last[0][0].decode() if last else "0-0"
        self._local.last = stream_id
        return _pack(stream_id)

    def _changes(self, cursor: int) -> tuple[int, list[str]] | None:
        start = _unpack(cursor)
        written: list[str] = []
        while True:
            def page(client: RedisCluster, ns: str, start: str = start) -> list[Any]:
                feed = f"{ns}:changes"
                return [client.xrange(feed, f"({start}", "+", count=_PAGE), client.xlen(feed),
                        client.xrange(feed, "-", "+", count=1)]

            entries, length, first = self.conn.call(page)
            if length >= FEED_LENGTH and first and _pack(first[0][0].decode()) > cursor:
                return None  # trimmed past our cursor: the caller rescans
            written += [v.decode() for _, fields in entries for v in fields.values()]
            if entries:
                start = entries[-1][0].decode()
            if len(entries) < _PAGE:
                break
        self._local.last = start
        return _pack(start), written

    def _wait(self, timeout: float) -> None:
        self._wait_read(timeout, [])

    def _wait_read(self, timeout: float, task_ids: Sequence[str]
                   ) -> dict[str, tuple[str, bytes]] | None:
        if timeout <= 0:
            return None
        last = getattr(self._local, "last", None)
        if last is None:
            self._cursor()
            last = self._local.last
        block = max(1, int(min(timeout, _MAX_BLOCK) * 1000))

        def wait(client: RedisCluster, ns: str) -> list[Any]:
            return cast("list[Any]", client.xread({f"{ns}:changes": last}, count=_PAGE,
                                                   block=block))

        woken = self.conn.call(wait)
        if woken:
            self._local.last = woken[0][1][-1][0].decode()
        return self._get(task_ids) if task_ids else None

    def chord_part(self, group_id: str, task_id: str, size: int) -> bool:
        expires = self.settings.result_expires
        ttl = max(1, math.ceil(expires * 1000)) if expires else 0

        def part(client: RedisCluster, ns: str) -> Any:
            # Both keys under the chord's hash tag: one slot, so one script (atomic).
            tag = "{" + f"{ns}:chord:{group_id}" + "}"
            script = client.register_script(CHORD_PART)
            return script(keys=[f"{tag}:parts", f"{tag}:fired"], args=[task_id, size, ttl])

        return int(self.conn.call(part)) == 1

    # -- maintenance ----------------------------------------------------------------------
    def forget(self, task_id: str) -> None:
        def drop(client: RedisCluster, ns: str) -> None:
            client.delete(f"{ns}:r:{task_id}")
            client.zrem(f"{ns}:expiring", task_id)

        self.conn.call(drop)

    def cleanup(self) -> int:
        return int(self.conn.call(
            lambda client, ns: client.zremrangebyscore(f"{ns}:expiring", "-inf", time.time())))

    def close(self) -> None:
        self.conn.close()
