"""Results on a Redis Cluster (``redis+cluster://``): ``redis.py``'s layout, spread by slot.

Keys are those of ``redis.py`` except the chord's::

    <ns>:r:<task_id>             string   anywhere: one key per task, any slot
    <ns>:expiring                zset     one key, so one slot
    <ns>:changes                 stream   one key, so one slot: every waiter reads one node
    {<ns>:chord:<gid>}:parts     set      the chord's two keys share a hash tag: the
    {<ns>:chord:<gid>}:fired     string   CHORD_PART script needs both in one slot

The change feed, its cursor, waiting, chords and maintenance are ``redis.py``'s. What a
single server does in one round trip takes several here, in an order that keeps the
promise a waiter relies on: a batch's values are written first (a pipeline the cluster
client splits by node), then its one change entry, so a reader that sees the entry finds
the values. ``store_part`` stores the result, then counts the part (the result is never
counted before it exists). A wake-up and the read of the values are two round trips (the
values live on other nodes than the feed).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from ..clients.redis.cluster import ClusterConnector
from .base import ResultBackend, Stored
from .redis import _PAGE, FEED_LENGTH, RedisBackend, encode_value, expiry_ms

if TYPE_CHECKING:
    from redis.cluster import RedisCluster

    from .redis import Client


class RedisClusterBackend(RedisBackend):
    scheme = "redis+cluster"
    connector = ClusterConnector

    def store_many(self, items: Sequence[Stored]) -> None:
        if not items:
            return

        def store(client: Client, ns: str) -> None:
            now = time.time()
            pipe = client.pipeline()
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

    # The single server's script writes the result and counts the part in one round
    # trip; its keys are in several slots here.
    store_part = ResultBackend.store_part

    def _mget(self, client: Client, keys: list[str]) -> list[bytes | None]:
        return cast("list[bytes | None]", cast("RedisCluster", client).mget_nonatomic(keys))

    def _block_read(self, client: Client, ns: str, last: str, block: int,
                    task_ids: Sequence[str]) -> tuple[list[Any], list[bytes | None]]:
        woken = cast("list[Any]", client.xread({f"{ns}:changes": last}, count=_PAGE,
                                                block=block))
        return woken, self._mget(client, [f"{ns}:r:{t}" for t in task_ids]) if task_ids else []

    def _chord_keys(self, ns: str, group_id: str) -> list[str]:
        # One hash tag, so one slot: the CHORD_PART script needs both keys there.
        tag = "{" + f"{ns}:chord:{group_id}" + "}"
        return [f"{tag}:parts", f"{tag}:fired"]
