"""Broadcasts (events, remote control) for a broker without fanout: SQS delivers each
message to one consumer, so what every subscriber must see goes through the
deployment's shared store: Redis pub/sub here, PostgreSQL's NOTIFY in ``fanout_pg``
(the result backend's, or the ``fanout_url`` transport option's). Without one,
broadcasts are dropped with one warning and subscriptions hear nothing: the cluster
runs, without events or remote control (as Celery on SQS does).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ...clients.net import mask_password
from ...errors import OperationalError
from ..base import Subscription
from .fanout_pg import PgFanout

if TYPE_CHECKING:
    import redis
    import redis.asyncio as aredis

logger = logging.getLogger("celeriac.transports.sqs")

_PREFIX = "celeriac.sqs"


def redis_url(url: str) -> str:
    """``url`` with only the query parameters redis-py reads (celeriac's own, such as
    ``namespace``, would make it fail)."""
    parts = urlsplit(url)
    kept = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
            if k in ("db", "username", "password", "protocol") or k.startswith("ssl_")]
    return urlunsplit(parts._replace(query=urlencode(kept)))


def open_fanout(url: str | None, prefix: str, connect_timeout: float) -> Fanout | PgFanout:
    """Broadcasts through ``url``: Redis pub/sub, PostgreSQL NOTIFY, or none (None)."""
    if url and urlsplit(url).scheme in ("postgres", "postgresql"):
        return PgFanout(url, prefix, connect_timeout)
    return Fanout(url, prefix, connect_timeout)


class Fanout:
    """Channels ``celeriac.sqs:<queue prefix>:<channel>`` on the Redis at ``url``."""

    def __init__(self, url: str | None, prefix: str, connect_timeout: float) -> None:
        self.url = redis_url(url) if url else None
        self.prefix = prefix
        self.connect_timeout = connect_timeout
        self._client: redis.Redis | None = None
        self._lock = threading.Lock()
        self._warned = False

    def channel(self, channel: str) -> str:
        return f"{_PREFIX}:{self.prefix}:{channel}"

    def _sync(self) -> redis.Redis:
        with self._lock:
            if self._client is None:
                import redis

                assert self.url is not None
                self._client = redis.Redis.from_url(
                    self.url, socket_connect_timeout=self.connect_timeout,
                    socket_timeout=max(self.connect_timeout, 5.0))
            return self._client

    def _warn_once(self) -> None:
        if not self._warned:
            self._warned = True
            logger.warning("SQS has no fanout and no Redis result backend (or fanout_url) "
                           "is set: events and remote control are dropped")

    def publish(self, channel: str, payload: bytes) -> None:
        if self.url is None:
            self._warn_once()
            return
        import redis

        try:
            self._sync().publish(self.channel(channel), payload)
        except (redis.RedisError, OSError) as exc:
            raise OperationalError(f"broadcast through {mask_password(self.url)} failed: "
                                   f"{exc}") from exc

    def has_subscribers(self, channel: str) -> bool:
        if self.url is None:
            return False
        import redis

        try:
            reply: Any = self._sync().pubsub_numsub(self.channel(channel))
        except (redis.RedisError, OSError):
            return True  # cannot tell: send, as if heard (the send reports the error)
        return bool(reply and int(reply[0][1]))

    def subscribers(self, channel: str) -> int | None:
        if self.url is None:
            return 0  # nobody can hear a command
        reply: Any = self._sync().pubsub_numsub(self.channel(channel))
        return int(reply[0][1]) if reply else 0

    async def subscribe(self, channel: str) -> Subscription:
        if self.url is None:
            self._warn_once()
            return Silent()
        import redis
        import redis.asyncio as aredis

        client = aredis.Redis.from_url(self.url, socket_connect_timeout=self.connect_timeout)
        pubsub = client.pubsub()
        try:
            await pubsub.subscribe(self.channel(channel))
            # Subscribed once the server confirms: only then is a later broadcast ours.
            deadline = time.monotonic() + self.connect_timeout
            while (left := deadline - time.monotonic()) > 0:
                msg = await pubsub.get_message(timeout=left)
                if msg is not None and msg["type"] == "subscribe":
                    return RedisFanoutSubscription(client, pubsub, mask_password(self.url))
            raise OperationalError(f"no confirmation of the subscription to {channel}")
        except (redis.RedisError, OSError) as exc:
            await _close(client, pubsub)
            raise OperationalError(f"subscribing through {mask_password(self.url)} "
                                   f"failed: {exc}") from exc
        except BaseException:
            await _close(client, pubsub)
            raise

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


async def _close(client: aredis.Redis, pubsub: aredis.client.PubSub) -> None:
    await pubsub.aclose()  # type: ignore[no-untyped-call]
    await client.aclose()


class RedisFanoutSubscription(Subscription):
    def __init__(self, client: aredis.Redis, pubsub: aredis.client.PubSub, where: str
                 ) -> None:
        self.client = client
        self.pubsub = pubsub
        self.where = where

    async def get(self, timeout: float) -> bytes | None:
        import redis

        deadline = time.monotonic() + timeout
        while True:
            left = max(deadline - time.monotonic(), 0.0)
            try:
                msg = await self.pubsub.get_message(ignore_subscribe_messages=True,
                                                    timeout=left)
            except (redis.RedisError, OSError) as exc:
                raise OperationalError(f"subscription on {self.where} lost: {exc}") from exc
            if msg is not None and msg["type"] == "message":
                return bytes(msg["data"])
            if left <= 0:
                return None

    async def close(self) -> None:
        await _close(self.client, self.pubsub)


class Silent(Subscription):
    """A subscription where nothing is ever broadcast (no fanout store)."""

    async def get(self, timeout: float) -> bytes | None:
        await asyncio.sleep(max(timeout, 0.0))  # sleep-ok: nothing can arrive
        return None

    async def close(self) -> None:
        return None
