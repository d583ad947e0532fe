"""Results in Celery's Redis layout (``redis://...?layout=celery``, or a kombu-layout
broker URL used as the backend): a Celery client's ``AsyncResult.get()`` reads what a
celeriac worker stored, and the reverse.

Keys, as Celery's ``RedisBackend`` writes them::

    celery-task-meta-<id>     string  JSON {"status", "result", "traceback", "children",
                                      "date_done", "task_id"} (+ "name", "args", "kwargs",
                                      "worker", "retries", "queue" with result_extended);
                                      SET with result_expires, then PUBLISHed on a channel
                                      of the same name (Celery's clients wait on it)
    celery-taskset-meta-<gid> string  {"result": [[gid, null], [[[id, null], null], ...]]}
                                      (``GroupResult.save``)
    celery-taskset-meta-<gid>.s  the chord's size (set by the producer)
    celery-taskset-meta-<gid>.j  zset: [1, id, state, result] per finished header task,
                                 scored by its group_index (Celery's result_chord_ordered)
    celery-taskset-meta-<gid>.t  Celery's counter of parts added later (add_to_chord)

A chord is counted as Celery counts it, so a chord whose header tasks run on Celery and
celeriac workers fires once: each part adds itself to ``.j`` and reads the count in one
step (Celery: one MULTI; here one script), and the part that sees ``.s + .t`` parts fires
the body. celeriac keeps two keys of its own beside them: ``celeriac-chord-fired-<gid>``
(which task fired: its re-run fires again, so a worker that died before it sent the
body loses nothing; the body's claim then stops a second run on celeriac workers) and
``celeriac-chord-done-<gid>`` (``.j`` renamed when it fired, for that re-run). Celery
deletes ``.j``/``.t``/``.s`` instead.

Waiting: a thread that waits subscribes to ``celery-task-meta-*`` (PSUBSCRIBE) and reads
a result again when its notification arrives; nothing polls. The channels are Celery's,
without the database (pub/sub is server-wide), so a write on another database of the
server wakes us too; harmless, since a notification only names a task id and the result
is read again from our own database.

``result_backend_transport_options={"global_keyprefix": "x"}`` puts ``x_`` (Celery adds
the ``_`` unless the prefix ends in one of ``:_-.``) in front of every one of these keys,
as Celery's backend does.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import orjson

from .. import states
from ..backends.base import GROUP_KEY_PREFIX, ResultBackend, Stored, tuple_id
from ..clients.redis import Connector
from ..clients.redis.scripts import script_source
from ..errors import ConfigurationError
from .redis_broker import split_options

if TYPE_CHECKING:
    import redis

    from ..settings import Settings

logger = logging.getLogger("celeriac.backends.celery_redis")

TASK_PREFIX = "celery-task-meta-"
GROUP_PREFIX = "celery-taskset-meta-"
FIRED_PREFIX = "celeriac-chord-fired-"
DONE_PREFIX = "celeriac-chord-done-"
CLAIM_PREFIX = "celeriac-chord-claim-"
_BODY_CLAIM = "chord-body:"
"""``followups.claimed`` counts a body's claim as a chord of one under this prefix."""
_CONTENT_TYPE = "application/json"

STORE_PART = script_source("celery_store_part", prelude="celery_chord_count")
CLAIM = script_source("celery_chord_claim", prelude=None)


class CeleryRedisBackend(ResultBackend):
    scheme = "redis"
    chord_sizes_stored = True
    expires_alone = True
    retries_with_request = True

    def __init__(self, url: str, settings: Settings) -> None:
        super().__init__(url, settings)
        if settings.result_serializer != "json":
            raise ConfigurationError(
                f"result_serializer={settings.result_serializer!r}: Celery's result layout "
                "is written in JSON here (Celery's default); set result_serializer='json'")
        split = [split_options(u) for u in url.split(";") if u.strip()]
        urls = [plain for plain, _ in split]
        self.conn = Connector(urls, settings, "result backend",
                              read_timeout=settings.broker_connection_timeout + 1.0)
        from_url = {k: v for _, ours in split for k, v in ours.items()}
        prefix = from_url.get("global_keyprefix", (
            settings.result_backend_transport_options or {}).get("global_keyprefix")) or ""
        if not isinstance(prefix, str):
            raise ConfigurationError(f"result_backend_transport_options['global_keyprefix'] "
                                     f"must be a string, got {prefix!r}")
        if prefix and prefix[-1] not in ":_-.":
            prefix += "_"  # Celery's rule (``_add_global_keyprefix``)
        self.task_prefix = prefix + TASK_PREFIX
        self.group_prefix = prefix + GROUP_PREFIX
        self.fired_prefix = prefix + FIRED_PREFIX
        self.done_prefix = prefix + DONE_PREFIX
        self.claim_prefix = prefix + CLAIM_PREFIX
        self._local = threading.local()
        self._members: dict[str, list[str]] = {}
        """Header task ids of chords this process fired, in order (``GroupResult.restore``
        by ``followups._fire`` reads them): Celery saves no member list for a plain
        chord."""

    # -- writing ------------------------------------------------------------------------
    def _serialize(self, task_id: str, meta: dict[str, Any],
                   extended: dict[str, Any] | None) -> tuple[str, bytes]:
        meta = orjson.loads(super()._serialize(task_id, meta, extended)[1])
        # Celery's key order and fields: children always, retries only when extended.
        shaped = {"status": meta["status"], "result": meta["result"],
                  "traceback": meta["traceback"], "children": meta.get("children") or [],
                  "date_done": meta["date_done"], "task_id": task_id}
        if extended and "name" in extended:
            shaped.update(name=meta.get("name"), args=meta.get("args"),
                          kwargs=meta.get("kwargs"), worker=meta.get("worker"),
                          retries=meta.get("retries"), queue=meta.get("queue"))
        return _CONTENT_TYPE, orjson.dumps(shaped)

    def store_many(self, items: Sequence[Stored]) -> None:
        if not items:
            return

        def store(client: redis.Redis, ns: str) -> None:
            now = time.time()
            with client.pipeline(transaction=True) as pipe:
                for task_id, _, data, expires_at in items:
                    if task_id.startswith(GROUP_KEY_PREFIX):
                        self._save_group(pipe, task_id[len(GROUP_KEY_PREFIX):], data,
                                         expires_at, now)
                        continue
                    key = self.task_prefix + task_id
                    _set(pipe, key, data, expires_at, now)
                    pipe.publish(key, data)
                pipe.execute()

        self.conn.call(store)

    def _save_group(self, pipe: Any, group_id: str, data: bytes, expires_at: float | None,
                    now: float) -> None:
        """celeriac's ``GroupResult.save`` as Celery's ``_save_group``, and the size a
        chord producer sets (``set_chord_size``) so Celery workers can count it."""
        ids = (orjson.loads(self.plain(data)).get("result") or {}).get("results") or []
        value = orjson.dumps({"result": [[group_id, None], [[[i, None], None] for i in ids]]})
        key = self.group_prefix + group_id
        _set(pipe, key, value, expires_at, now)
        pipe.publish(key, value)
        _set(pipe, f"{key}.s", str(len(ids)).encode(), expires_at, now)

    # -- reading ------------------------------------------------------------------------
    def _get(self, task_ids: Sequence[str]) -> dict[str, tuple[str, bytes]]:
        if not task_ids:
            return {}
        keys = [self.group_prefix + t[len(GROUP_KEY_PREFIX):] if t.startswith(GROUP_KEY_PREFIX)
                else self.task_prefix + t for t in task_ids]
        values = cast("list[bytes | None]", self.conn.call(lambda c, ns: c.mget(keys)))
        out: dict[str, tuple[str, bytes]] = {}
        for task_id, value in zip(task_ids, values, strict=True):
            if task_id.startswith(GROUP_KEY_PREFIX):
                group = self._group_meta(task_id[len(GROUP_KEY_PREFIX):], value)
                if group is not None:
                    out[task_id] = (_CONTENT_TYPE, group)
            elif value is not None:
                out[task_id] = (_CONTENT_TYPE, value)
        return out

    def _group_meta(self, group_id: str, value: bytes | None) -> bytes | None:
        """A saved group in celeriac's shape (``GroupResult.restore``): from Celery's
        taskset key, or the members of a chord this process fired."""
        ids = self._members.get(group_id)
        if ids is None and value is not None:
            try:
                ids = [tuple_id(node) for node in orjson.loads(self.plain(value))["result"][1]]
            except (orjson.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
                logger.warning("group %s: Celery's saved group is unreadable: %s",
                               group_id, exc)
                return None
        if ids is None:
            return None
        return orjson.dumps({"status": states.SUCCESS, "task_id": group_id, "result":
                             {"group_id": group_id, "results": ids}})

    def forget(self, task_id: str) -> None:
        key = self.group_prefix + task_id[len(GROUP_KEY_PREFIX):] \
            if task_id.startswith(GROUP_KEY_PREFIX) else self.task_prefix + task_id
        self.conn.call(lambda client, ns: client.delete(key))

    def cleanup(self) -> int:
        return 0  # every key carries its own expiry (SET PX / EXPIRE), as Celery's do

    # -- chords, counted as Celery's Redis backend counts them ---------------------------
    def store_part(self, part: Stored, group_id: str, size: int,
                   index: int | None = None) -> bool:
        return self._count(group_id, part.task_id, size, index, part)

    def chord_part(self, group_id: str, task_id: str, size: int) -> bool:
        if group_id.startswith(_BODY_CLAIM):
            key = self.claim_prefix + group_id[len(_BODY_CLAIM):]
            ttl = self._ttl() or 86400 * 365 * 1000
            return int(self.conn.call(lambda client, ns: client.register_script(CLAIM)(
                keys=[key], args=[task_id, ttl], client=client))) == 1
        return self._count(group_id, task_id, size, None, None)

    def _count(self, group_id: str, task_id: str, size: int, index: int | None,
               part: Stored | None) -> bool:
        if part is None:  # counted without a new result: the stored one (a failed step)
            found = self._get([task_id]).get(task_id)
            meta = orjson.loads(self.plain(found[1])) if found else {"status": states.FAILURE,
                                                         "result": None}
        else:
            meta = orjson.loads(self.plain(part.data))
        member = orjson.dumps([1, task_id, meta.get("status"), meta.get("result")])
        score = "+inf" if index is None else str(index)
        value, px = (b"", 0) if part is None else (part.data, 0 if part.expires_at is None
                                                    else _ms(part.expires_at, time.time()))
        group = self.group_prefix + group_id
        keys = [self.task_prefix + task_id, f"{group}.j", f"{group}.t", f"{group}.s",
                self.fired_prefix + group_id, self.done_prefix + group_id]

        def run(client: redis.Redis, ns: str) -> Any:
            return client.register_script(STORE_PART)(
                keys=keys, args=[value, px, member, score, size, self._ttl(), task_id],
                client=client)

        fired = self.conn.call(run)
        if not fired:
            return False
        self._members[group_id] = [orjson.loads(self.plain(m))[1] for m in fired]
        if len(self._members) > 1000:  # only the newest are read (right after firing)
            self._members.pop(next(iter(self._members)))
        return True

    def _ttl(self) -> int:
        """Chord state's expiry in ms (0: none): the results', to the millisecond, so a
        chord's parts never outlive the results they count."""
        expires = self.settings.result_expires
        return max(1, math.ceil(expires * 1000)) if expires else 0

    # -- waiting: Celery's notifications --------------------------------------------------
    def _cursor(self) -> int:
        listener = self._listener()
        self._drain(listener, 0.0)
        self._local.seen = []
        return 0

    def _changes(self, cursor: int) -> tuple[int, list[str]] | None:
        seen: list[str] = getattr(self._local, "seen", [])
        self._local.seen = []
        return cursor + 1, seen

    def _wait(self, timeout: float) -> None:
        try:
            self._drain(self._listener(), timeout)
        except Exception as exc:  # a lost subscription: read again after a pause
            logger.warning("result notifications lost (%s); resubscribing", exc)
            self._local.listener = None
            time.sleep(max(0.0, min(timeout, 0.1)))

    def _listener(self) -> Any:
        listener = getattr(self._local, "listener", None)
        if listener is None:
            def subscribe(client: redis.Redis, ns: str) -> Any:
                pubsub = client.pubsub()  # type: ignore[no-untyped-call]
                pubsub.psubscribe(_glob_escape(self.task_prefix) + "*")
                return pubsub

            listener = self._local.listener = self.conn.call(subscribe)
        return listener

    def _drain(self, listener: Any, timeout: float) -> None:
        """Wait up to ``timeout`` for a notification, then take every one waiting."""
        seen: list[str] = getattr(self._local, "seen", [])
        self._local.seen = seen
        deadline = time.monotonic() + timeout
        while True:
            remaining = max(deadline - time.monotonic(), 0.0)
            msg = listener.get_message(timeout=remaining)
            if msg is not None and msg["type"] == "pmessage":
                seen.append(msg["channel"].decode()[len(self.task_prefix):])
                deadline = 0.0  # one arrived: take the rest without waiting
            elif msg is None and remaining <= 0:
                return

    def close(self) -> None:
        listener = getattr(self._local, "listener", None)
        if listener is not None:
            listener.close()
            self._local.listener = None
        self.conn.close()


def _set(pipe: Any, key: str, value: bytes, expires_at: float | None, now: float) -> None:
    if expires_at is None:
        pipe.set(key, value)
    else:
        pipe.set(key, value, px=_ms(expires_at, now))


def _ms(expires_at: float, now: float) -> int:
    return max(1, math.ceil((expires_at - now) * 1000))


def _glob_escape(text: str) -> str:
    """``text`` matched literally in a PSUBSCRIBE pattern."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)
