"""Results in Redis.

Keys (``<ns>`` is the URL's ``?namespace=``, default ``celeriac``)::

    <ns>:r:<task_id>   string  content type, a newline, the serialized result; SET with
                               PX result_expires (no expiry when it is None)
    <ns>:expiring      zset    task id -> expiry (unix s), only so that cleanup() can say
                               how many results expired; Redis itself deletes the values
    <ns>:changes       stream  one entry {t: task_id} per store (or {t0: id, t1: id, ...}
                               per batch the worker stores), MAXLEN ~ FEED_LENGTH
    <ns>:chord:<gid>:parts
                       set     the header task ids of chord <gid> counted so far
    <ns>:chord:<gid>:fired
                       string  "1" once the chord's count reached its size; both chord
                               keys PEXPIREd by result_expires at every chord_part (no
                               expiry when it is None)

A store is one MULTI/EXEC round trip (value, expiry index, change entry), so a reader
that sees the change entry sees the value. ``wait_for`` reads only the change entries
past its cursor (a stream id packed into an int), and ``_wait`` blocks in Redis with
XREAD BLOCK from the calling thread's last cursor: a store made between a reader's check
and its sleep is already in the stream, so it wakes the sleeper at once. Nothing polls.

``chord_part`` is one Lua script (``CHORD_PART``; ``STORE_PART`` stores the header task's
result first, in the same round trip): Redis runs a script without
interleaving any other command, so adding the part, counting and setting the fired flag
(SET NX, whose reply says whether this call set it) is atomic across every client.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from ..clients.redis import Connector
from ..clients.redis.scripts import script_source
from .base import ResultBackend, Stored

if TYPE_CHECKING:
    import redis
    from redis.cluster import RedisCluster

    from ..clients.redis.cluster import ClusterConnector
    from ..settings import Settings

    Client = redis.Redis | RedisCluster
    """What the calls shared with ``redis_cluster.py`` are made on: a command both offer."""

FEED_LENGTH = 100_000
"""Change entries kept; a waiter that falls further behind rescans what it waits for."""
_PAGE = 10_000
POSITION_FRESH = 0.02
"""Seconds: how old a thread's wait position may be for a ``get()`` to start waiting from
it (``_position_before``), skipping the read that takes a new one. Older, the feed entries
written since (every result's) could cost more to read than the round trip it saves."""
_MAX_BLOCK = 1.0
"""Longest XREAD BLOCK (s); base.wait_for never asks for more."""


CHORD_PART = script_source("results_chord_part", prelude="results_chord_count")
STORE_PART = script_source("results_store_part", prelude="results_chord_count")


class RedisBackend(ResultBackend):
    scheme = "redis"

    def __init__(self, url: str, settings: Settings) -> None:
        super().__init__(url, settings)
        # The socket timeout covers the longest block plus a slow network.
        self.conn: Connector | ClusterConnector = self.connector(
            url.split(";"), settings, "result backend",
            read_timeout=settings.broker_connection_timeout + _MAX_BLOCK,
            options=settings.result_backend_transport_options)
        self._local = threading.local()

    connector: Callable[..., Connector | ClusterConnector] = Connector

    def store_many(self, items: Sequence[Stored]) -> None:
        if not items:
            return

        def store(client: Client, ns: str) -> None:
            now = time.time()
            with client.pipeline(transaction=True) as pipe:
                for task_id, content_type, data, expires_at in items:
                    key = f"{ns}:r:{task_id}"
                    value = encode_value(content_type, data)
                    if expires_at is None:
                        pipe.set(key, value)
                        pipe.zrem(f"{ns}:expiring", task_id)
                    else:
                        pipe.set(key, value, px=expiry_ms(expires_at, now))
                        pipe.zadd(f"{ns}:expiring", {task_id: expires_at})
                    pipe.xadd(f"{ns}:changes", {"t": task_id}, maxlen=FEED_LENGTH,
                              approximate=True)
                pipe.execute()

        self.conn.call(store)

    def _get(self, task_ids: Sequence[str]) -> dict[str, tuple[str, bytes]]:
        if not task_ids:
            return {}
        replies = self._lane(lambda ns: [("MGET", *[f"{ns}:r:{t}" for t in task_ids])])
        if replies is not None:
            return _values(task_ids, replies[0])

        def read(client: Client, ns: str) -> list[bytes | None]:
            return self._mget(client, [f"{ns}:r:{t}" for t in task_ids])

        return _values(task_ids, self.conn.call(read))

    def _lane(self, build: Callable[[str], Sequence[Sequence[Any]]], *, spin: bool = False
              ) -> list[Any] | None:
        """The replies to ``build(namespace)``'s commands, pipelined over the connector's
        lane (``Connector.pipeline``); None without one (a Cluster, TLS). A caller's
        ``get()`` makes these reads: redis-py spends about 100 us of CPU on each, a lane
        about 30 (on 2 CPUs, CPU the worker running the task needs). No spin by
        default: the worker answers in hundreds of microseconds, not tens."""
        if not isinstance(self.conn, Connector):
            return None
        return self.conn.pipeline(build, spin=spin)

    def _mget(self, client: Client, keys: list[str]) -> list[bytes | None]:
        # decode_responses is off: values are bytes (redis-py types them loosely).
        return cast("list[bytes | None]", client.mget(keys))

    # -- the change feed ------------------------------------------------------------------
    def _cursor(self) -> int:
        replies = self._lane(lambda ns: [("XREVRANGE", f"{ns}:changes", "+", "-", "COUNT", 1)])
        if replies is not None:
            return self._last(replies[0])

        def read(client: Client, ns: str) -> list[Any]:
            return cast("list[Any]", client.xrevrange(f"{ns}:changes", count=1))

        return self._last(self.conn.call(read))

    def _last(self, entries: list[Any]) -> int:
        """The cursor at the newest of ``entries`` (an XREVRANGE reply), kept as this
        thread's wait position too."""
        stream_id = entries[0][0].decode() if entries else "0-0"
        self._moved(stream_id)
        return _pack(stream_id)

    def _moved(self, stream_id: str) -> None:
        """This thread's wait position is now ``stream_id``, as of this moment."""
        self._local.last = stream_id
        self._local.at = time.monotonic()

    def _position_before(self, since: float) -> bool:
        at: float | None = getattr(self._local, "at", None)
        # Recent, too: a position far behind would cost reads of what came since.
        return at is not None and at < since and time.monotonic() - at < POSITION_FRESH

    def _cursor_and_read(self, task_ids: Sequence[str]
                         ) -> tuple[int | None, dict[str, tuple[str, bytes]] | None]:
        # One round trip: the cursor first, then the values (a value written after the
        # cursor was taken has its feed entry after it, so the wait that follows sees it).
        replies = self._lane(lambda ns: [("XREVRANGE", f"{ns}:changes", "+", "-", "COUNT", 1),
                                         ("MGET", *[f"{ns}:r:{t}" for t in task_ids])])
        if replies is None:
            return self._cursor(), None
        return self._last(replies[0]), _values(task_ids, replies[1])

    def _changes(self, cursor: int) -> tuple[int, list[str]] | None:
        start = _unpack(cursor)
        written: list[str] = []
        while True:
            entries, length, first = self.conn.call(functools.partial(_read_feed, start=start))
            # Trimming keeps at least FEED_LENGTH entries; if it ate our cursor's entry,
            # entries after it may be gone too: ask the caller to rescan instead.
            if length >= FEED_LENGTH and first and _pack(first[0][0].decode()) > cursor:
                return None
            # An entry holds one id (t) or, from the worker's exchange script, several
            # (t0, t1, ...).
            written += [v.decode() for _, fields in entries for v in fields.values()]
            if entries:
                start = entries[-1][0].decode()
            if len(entries) < _PAGE:
                break
        self._moved(start)
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
        # XREAD's BLOCK 0 means forever: at least one millisecond.
        block = max(1, int(min(timeout, _MAX_BLOCK) * 1000))
        # Pipelined: Redis runs the MGET only once the XREAD returns, so the values come
        # back in the same round trip as the wake-up, and are at least as new (a store
        # writes its value and its feed entry in one transaction or script).
        replies = self._lane(lambda ns: [
            ("XREAD", "COUNT", _PAGE, "BLOCK", block, "STREAMS", f"{ns}:changes", last),
            *([("MGET", *[f"{ns}:r:{t}" for t in task_ids])] if task_ids else [])])
        if replies is not None:
            woken, values = replies[0], replies[1] if task_ids else []
        else:
            woken, values = self.conn.call(functools.partial(
                self._block_read, last=last, block=block, task_ids=task_ids))
        if woken:
            # Past what it returned: the next wait sleeps until something newer (a
            # waiter that rereads its ids directly never calls _changes to move it).
            self._moved(woken[0][1][-1][0].decode())
        return _values(task_ids, values) if task_ids else None

    def _block_read(self, client: Client, ns: str, last: str, block: int,
                    task_ids: Sequence[str]) -> tuple[list[Any], list[bytes | None]]:
        """XREAD BLOCK past ``last``, then the values of ``task_ids`` (redis-py's, where
        there is no lane: see ``_wait_read``)."""
        pipe = client.pipeline(transaction=False)
        pipe.xread({f"{ns}:changes": last}, count=_PAGE, block=block)
        if task_ids:
            pipe.mget([f"{ns}:r:{t}" for t in task_ids])
        replies = pipe.execute()
        return replies[0], replies[1] if task_ids else []

    def chord_part(self, group_id: str, task_id: str, size: int) -> bool:
        expires = self.settings.result_expires
        ttl = max(1, math.ceil(expires * 1000)) if expires else 0

        def part(client: Client, ns: str) -> Any:
            # One script, so no other client's command runs between the SADD, the SCARD
            # and the SET NX (a MULTI could not branch on the count).
            script = client.register_script(CHORD_PART)
            return script(keys=self._chord_keys(ns, group_id), args=[task_id, size, ttl])

        return int(self.conn.call(part)) == 1

    def _chord_keys(self, ns: str, group_id: str) -> list[str]:
        """The chord's parts set and fired flag."""
        return [f"{ns}:chord:{group_id}:parts", f"{ns}:chord:{group_id}:fired"]

    def store_part(self, part: Stored, group_id: str, size: int,
                   index: int | None = None) -> bool:
        expires = self.settings.result_expires
        ttl = max(1, math.ceil(expires * 1000)) if expires else 0
        task_id, content_type, data, expires_at = part

        def store_and_count(client: Client, ns: str) -> Any:
            now = time.time()
            px = expiry_ms(expires_at, now) if expires_at is not None else 0
            script = client.register_script(STORE_PART)
            return script(keys=[f"{ns}:r:{task_id}", f"{ns}:expiring", f"{ns}:changes",
                                *self._chord_keys(ns, group_id)],
                          args=[task_id, encode_value(content_type, data), px,
                                expires_at or 0, size, ttl, FEED_LENGTH])

        return int(self.conn.call(store_and_count)) == 1

    # -- maintenance ----------------------------------------------------------------------
    def forget(self, task_id: str) -> None:
        def drop(client: Client, ns: str) -> None:
            # Not a transaction: on a Cluster the two keys are in different slots, and the
            # expiry index only feeds cleanup()'s count.
            with client.pipeline(transaction=False) as pipe:
                pipe.delete(f"{ns}:r:{task_id}")
                pipe.zrem(f"{ns}:expiring", task_id)
                pipe.execute()

        self.conn.call(drop)

    def cleanup(self) -> int:
        # Redis has deleted the values already (PX); this forgets their index entries and
        # counts them.
        return int(self.conn.call(
            lambda client, ns: client.zremrangebyscore(f"{ns}:expiring", "-inf", time.time())))

    def close(self) -> None:
        self.conn.close()


def _values(task_ids: Sequence[str], values: list[bytes | None]
            ) -> dict[str, tuple[str, bytes]]:
    """An MGET of result keys as ``_get`` returns it."""
    out: dict[str, tuple[str, bytes]] = {}
    for tid, value in zip(task_ids, values, strict=True):
        if value is not None:
            content_type, _, data = value.partition(b"\n")
            out[tid] = (content_type.decode(), data)
    return out


def encode_value(content_type: str, data: bytes) -> bytes:
    """A result as its key holds it (the transport's ``exchange`` script writes it too)."""
    return content_type.encode() + b"\n" + data


def expiry_ms(expires_at: float, now: float) -> int:
    # Relative to now, so the client's and the server's clocks need not agree.
    return max(1, math.ceil((expires_at - now) * 1000))


def _read_feed(client: Client, ns: str, start: str) -> list[Any]:
    """One page of entries after ``start``, the feed's length, and its first entry."""
    feed = f"{ns}:changes"
    pipe = client.pipeline(transaction=False)
    pipe.xrange(feed, f"({start}", "+", count=_PAGE)
    pipe.xlen(feed)
    pipe.xrange(feed, "-", "+", count=1)
    return pipe.execute()


def _pack(stream_id: str) -> int:
    """A stream id ``ms-seq`` as one int that sorts the same way."""
    ms, _, seq = stream_id.partition("-")
    return (int(ms) << 64) | int(seq or 0)


def _unpack(cursor: int) -> str:
    return f"{cursor >> 64}-{cursor & ((1 << 64) - 1)}"
