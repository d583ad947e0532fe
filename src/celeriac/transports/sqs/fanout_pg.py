"""Broadcasts through PostgreSQL (a ``postgresql://`` result backend or ``fanout_url``):
``NOTIFY`` to every session that ``LISTEN``s.

A NOTIFY payload is text of at most 8000 bytes, and an event batch or a control reply
can be larger: a payload goes as base64 in parts of ``PART`` characters, ``<message
id>:<part>:<parts>:<text>``, all in one transaction (PostgreSQL delivers one
transaction's notifications together and in order), and the subscriber joins them. A
channel is ``celeriac_sqs_<hash of the queue prefix and the channel>`` (identifiers are
63 bytes at most).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import threading
import time
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ...clients.net import mask_password
from ...errors import OperationalError
from ..base import Subscription

if TYPE_CHECKING:
    import psycopg

PART = 7000
"""Characters of base64 per NOTIFY (PostgreSQL's payload limit is 8000 bytes)."""
_LIBPQ = ("sslmode", "sslrootcert", "sslcert", "sslkey", "connect_timeout", "user",
          "password", "host", "port", "dbname", "application_name", "target_session_attrs")


def pg_url(url: str) -> str:
    """``url`` with only libpq's query parameters (celeriac's ``namespace`` is not one)."""
    parts = urlsplit(url)
    kept = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k in _LIBPQ]
    scheme = "postgresql" if parts.scheme == "postgres" else parts.scheme
    return urlunsplit(parts._replace(scheme=scheme, query=urlencode(kept)))


class PgFanout:
    def __init__(self, url: str, prefix: str, connect_timeout: float) -> None:
        self.url = pg_url(url)
        self.where = mask_password(self.url)
        self.prefix = prefix
        self.connect_timeout = connect_timeout
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()

    def channel(self, channel: str) -> str:
        digest = hashlib.sha1(f"{self.prefix}:{channel}".encode()).hexdigest()[:40]
        return f"celeriac_sqs_{digest}"

    def publish(self, channel: str, payload: bytes) -> None:
        import psycopg

        text = base64.b64encode(payload).decode("ascii")
        parts = [text[i:i + PART] for i in range(0, len(text), PART)] or [""]
        mid = uuid.uuid4().hex[:12]
        name = self.channel(channel)
        with self._lock:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = psycopg.connect(self.url, connect_timeout=max(
                        1, int(self.connect_timeout)))
                with self._conn.transaction():
                    for n, part in enumerate(parts):
                        self._conn.execute("SELECT pg_notify(%s, %s)",
                                           (name, f"{mid}:{n}:{len(parts)}:{part}"))
            except psycopg.Error as exc:
                self._drop()
                raise OperationalError(f"broadcast through {self.where} failed: {exc}"
                                       ) from exc

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def has_subscribers(self, channel: str) -> bool:
        return True  # PostgreSQL does not say who listens

    def subscribers(self, channel: str) -> int | None:
        return None

    async def subscribe(self, channel: str) -> Subscription:
        import psycopg
        from psycopg import sql

        try:
            conn = await psycopg.AsyncConnection.connect(
                self.url, autocommit=True, connect_timeout=max(1, int(self.connect_timeout)))
        except psycopg.Error as exc:
            raise OperationalError(f"subscribing through {self.where} failed: {exc}") from exc
        try:
            # LISTEN has returned: from now on a NOTIFY on the channel is ours.
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel(channel))))
        except BaseException:
            await conn.close()
            raise
        return PgSubscription(conn, self.where)

    def close(self) -> None:
        with self._lock:
            self._drop()


class PgSubscription(Subscription):
    def __init__(self, conn: psycopg.AsyncConnection[Any], where: str) -> None:
        self.conn = conn
        self.where = where
        self._parts: dict[str, list[str]] = {}
        self._received: deque[str] = deque()

    async def get(self, timeout: float) -> bytes | None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            while self._received:
                whole = self._join(self._received.popleft())
                if whole is not None:
                    return whole
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                # Everything the packet brought is kept, even past stop_after: returning
                # from inside the loop would drop the rest.
                async for notify in self.conn.notifies(timeout=left, stop_after=1):
                    self._received.append(notify.payload)
            except psycopg.Error as exc:
                raise OperationalError(f"subscription on {self.where} lost: {exc}") from exc

    def _join(self, payload: str) -> bytes | None:
        """The payload once its last part came; None before (or for a malformed part,
        which nothing of ours sends: skipped)."""
        try:
            mid, n, total, text = payload.split(":", 3)
            index, count = int(n), int(total)
        except ValueError:
            return None
        parts = self._parts.setdefault(mid, [])
        if index != len(parts):  # a part lost or out of order: drop what was joined
            self._parts.pop(mid, None)
            return None
        parts.append(text)
        if len(parts) < count:
            return None
        del self._parts[mid]
        try:
            return base64.b64decode("".join(parts), validate=True)
        except (binascii.Error, ValueError):
            return None

    async def close(self) -> None:
        await self.conn.close()
