"""kombu's Redis layout, as Celery's workers and producers read and write it: key names,
priority steps, the message envelope, and the scripts the kombu-layout transport runs.

What kombu (``kombu/transport/redis.py``, ``kombu/transport/virtual/base.py``) keeps in
Redis, with its default transport options::

    <queue>, <queue>\\x06\\x163, <queue>\\x06\\x166, <queue>\\x06\\x169
                       lists   the ready messages of one queue, one list per priority
                               step (0, 3, 6, 9: a priority rounds down to its step); a
                               producer LPUSHes, a consumer BRPOPs the step-0 list of
                               every queue first, so on kombu's Redis 0 is the HIGHEST
                               priority
    _kombu.binding.<exchange>, _kombu.binding_permanent.<exchange> (kombu 5.7)
                       set     "<routing key>\\x06\\x16<pattern>\\x06\\x16<queue>" per binding;
                               read to route a restored message back to its queue
    unacked            hash    delivery tag -> JSON [envelope, exchange, routing key]:
                               messages handed out and not yet acknowledged
    unacked_index      zset    delivery tag -> when it was handed out (unix seconds)
    unacked_mutex      string  held (SET NX, 300 s) by whoever restores timed-out messages

A message in a list is one JSON object::

    {"body": base64 of the serialized [args, kwargs, embed], "content-encoding": "utf-8",
     "content-type": "application/json", "headers": {protocol v2 headers},
     "properties": {"correlation_id", "reply_to", "delivery_mode": 2,
                    "delivery_info": {"exchange": "", "routing_key": <queue>},
                    "priority": 0, "body_encoding": "base64", "delivery_tag": <uuid>}}

Keys of celeriac's own (kombu never reads a key it did not name, so they sit beside
kombu's harmlessly): ``_celeriac.kombu.delayed`` (zset, id -> due unix ms) and
``_celeriac.kombu.delayed.m`` (hash, id -> "<list key>\\n<envelope>"): where a celeriac
worker parks a message until its ``eta`` or a lost delivery's backoff;
``_celeriac.kombu.dead`` (hash, id -> JSON record) and ``_celeriac.kombu.dead.ids`` (zset,
order of death): dead letters; ``_celeriac.kombu.seq``: ids for both.

With kombu's ``global_keyprefix`` transport option every one of these names, and every
pub/sub channel, starts with that prefix (``Keys``), as kombu's prefixing client makes
them; the queue names inside binding members and envelopes stay unprefixed.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from ..clients.redis.scripts import script_source
from ..errors import DecodeError
from ..protocol import DECODE_ERROR_HEADER, Message, new_id
from ..transports.base import DeadLetter

if TYPE_CHECKING:
    import redis

@dataclass(frozen=True, slots=True)
class Exchange:
    """A kombu exchange as Celery declares it (on RabbitMQ the declaration must match
    argument for argument, or the second declarer's channel is closed)."""

    name: str
    type: str
    """``fanout``, ``topic`` or ``direct``."""
    durable: bool


SEP = "\x06\x16"
PRIORITY_STEPS = (0, 3, 6, 9)
UNACKED = "unacked"
UNACKED_INDEX = "unacked_index"
UNACKED_MUTEX = "unacked_mutex"
MUTEX_EXPIRE_MS = 300_000
"""kombu's ``unacked_mutex_expire`` (5 minutes)."""
VISIBILITY_TIMEOUT = 3600.0
"""kombu's default ``visibility_timeout``: an unacknowledged message is restored to its
queue by any worker this many seconds after it was handed out."""
BINDING = "_kombu.binding.{}"
BINDING_PERMANENT = "_kombu.binding_permanent.{}"
"""kombu 5.7: a binding table with members here is never swept as expired."""
DELAYED = "_celeriac.kombu.delayed"
DELAYED_MSGS = "_celeriac.kombu.delayed.m"
DEAD = "_celeriac.kombu.dead"
DEAD_IDS = "_celeriac.kombu.dead.ids"
SEQ = "_celeriac.kombu.seq"
BINDING_DEADLINES = "_kombu.binding_deadlines"
"""kombu 5.7: binding set -> when it expires (the reply queues' sets)."""
COUNT_HEADER = "x-celeriac-deliveries"
"""Losses so far, carried in the message (kombu keeps no count; it only sets
``redelivered``), so ``task_max_deliveries`` holds on this layout too."""


class Keys:
    """kombu's key names under its ``global_keyprefix`` (none by default)."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self.unacked = prefix + UNACKED
        self.unacked_index = prefix + UNACKED_INDEX
        self.unacked_mutex = prefix + UNACKED_MUTEX
        self.delayed = prefix + DELAYED
        self.delayed_msgs = prefix + DELAYED_MSGS
        self.dead = prefix + DEAD
        self.dead_ids = prefix + DEAD_IDS
        self.seq = prefix + SEQ
        self.binding_deadlines = prefix + BINDING_DEADLINES

    def binding(self, exchange: str) -> str:
        return self.prefix + BINDING.format(exchange)

    def binding_permanent(self, exchange: str) -> str:
        return self.prefix + BINDING_PERMANENT.format(exchange)

    def queue(self, name: str) -> str:
        """The list of a queue without priority steps (a reply queue)."""
        return self.prefix + name

    def list_key(self, queue: str, priority: int) -> str:
        return self.prefix + list_key(queue, priority)

    def list_keys(self, queues: Sequence[str]) -> list[tuple[str, str]]:
        return [(self.prefix + key, queue) for key, queue in list_keys(queues)]

    def queue_of(self, key: str) -> str:
        return queue_of(key[len(self.prefix):] if key.startswith(self.prefix) else key)


def step(priority: int) -> int:
    """kombu's ``priority()``: a priority rounded down to its step."""
    return PRIORITY_STEPS[bisect.bisect(PRIORITY_STEPS, priority) - 1]


def list_key(queue: str, priority: int) -> str:
    """kombu's ``_q_for_pri``: the list a message of ``priority`` waits in."""
    pri = step(min(max(priority, 0), 9))
    return f"{queue}{SEP}{pri}" if pri else queue


def list_keys(queues: Sequence[str]) -> list[tuple[str, str]]:
    """``(list key, queue)`` in the order kombu's consumer pops them: every queue's
    step-0 list first, then step 3..."""
    return [(list_key(q, p), q) for p in PRIORITY_STEPS for q in queues]


def queue_of(key: str) -> str:
    return key.rsplit(SEP, 1)[0] if SEP in key else key


def binding_member(queue: str) -> str:
    """Celery's binding of a queue it creates: exchange and routing key named after it."""
    return SEP.join([queue, "", queue])


_TOPIC_WILDCARDS = {"*": r"[^\.]+", "#": r".*?"}


def topic_member(queue: str, pattern: str) -> str:
    """kombu's binding of ``queue`` to a topic exchange by ``pattern``: the pattern, the
    regular expression kombu's producers match routing keys with (kombu 5.7's
    ``TopicExchange.key_to_pattern``, byte for byte), and the queue."""
    return SEP.join([pattern, topic_regex(pattern), queue])


def topic_regex(pattern: str) -> str:
    """kombu's regular expression for a topic binding pattern: ``*`` one word, ``#``
    any text, so ``a.#`` needs the dot (RabbitMQ's ``#`` also matches no word)."""
    escaped = "".join(c if c.isalnum() or c in ".#*" else "\\000" if c == "\000" else
                      "\\" + c for c in pattern)
    return "^" + r"\.".join(_TOPIC_WILDCARDS.get(w, w) for w in escaped.split(".")) + "$"


def bound_queue(members: Sequence[Sequence[str]], routing_key: str) -> str | None:
    """The queue a restored message of an exchange goes back to, from the exchange's
    binding members ``(routing key, pattern, queue)``: the one bound by its routing key
    (direct), else the first by name whose topic pattern matches it. kombu copies it
    into every matching queue; one copy runs it once (on a queue of that pattern)."""
    direct = sorted(m[2] for m in members if len(m) == 3 and m[0] == routing_key)
    if direct:
        return direct[0]
    topic = sorted(m[2] for m in members if len(m) == 3 and m[1] and
                   _regex_matches(m[1], routing_key))
    return topic[0] if topic else None


def _regex_matches(pattern: str, routing_key: str) -> bool:
    try:
        return re.match(pattern, routing_key) is not None
    except re.error:
        return False


def envelope(queue: str, message: Message) -> bytes:
    """The JSON kombu's producer would LPUSH for ``message`` on ``queue`` (Celery sends a
    task through the default exchange, routing key = queue name)."""
    props = message.properties
    return orjson.dumps({
        "body": base64.b64encode(message.body).decode("ascii"),
        "content-encoding": message.content_encoding,
        "content-type": message.content_type,
        "headers": message.headers,
        "properties": {
            "correlation_id": props.get("correlation_id") or message.headers.get("id"),
            "reply_to": props.get("reply_to"),
            "delivery_mode": props.get("delivery_mode") or 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": message.priority,
            "body_encoding": "base64",
            "delivery_tag": new_id(),
        },
    })


def broadcast_envelope(body: bytes, headers: Mapping[str, Any], exchange: str,
                       routing_key: str) -> bytes:
    """The JSON kombu's virtual channel sends for a JSON ``body`` published through
    ``exchange`` (Celery's events, remote-control commands and replies): transient, and
    tagged, since kombu's consumer reads ``delivery_tag`` from every message."""
    return orjson.dumps({
        "body": base64.b64encode(body).decode("ascii"),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": dict(headers),
        "properties": {
            "delivery_mode": 1,
            "delivery_info": {"exchange": exchange, "routing_key": routing_key},
            "priority": 0,
            "body_encoding": "base64",
            "delivery_tag": new_id(),
        },
    })


def broadcast_body(raw: bytes) -> bytes | None:
    """The body of a kombu envelope (``broadcast_envelope``'s, or any kombu client's);
    None when ``raw`` is not one."""
    try:
        env = orjson.loads(raw)
        props = env["properties"]
        body = env.get("body") or ""
        if props.get("body_encoding") == "base64":
            return base64.b64decode(body, validate=True)
        return body.encode() if isinstance(body, str) else None
    except (orjson.JSONDecodeError, binascii.Error, KeyError, TypeError, AttributeError,
            ValueError):
        return None


def parse(raw: bytes) -> tuple[Message, dict[str, Any]]:
    """A kombu envelope as a ``Message`` (body decoded) and the envelope itself. An
    envelope that cannot be read comes back as a message the consumer dead-letters."""
    try:
        env = orjson.loads(raw)
        if not isinstance(env, dict) or not isinstance(env.get("properties"), dict):
            raise DecodeError("not a kombu message envelope")
        props: dict[str, Any] = env["properties"]
        body = env.get("body") or ""
        encoding = props.get("body_encoding")
        if encoding == "base64":
            data = base64.b64decode(body, validate=True)
        elif encoding in (None, "utf-8") and isinstance(body, str):
            data = body.encode()
        else:
            raise DecodeError(f"body_encoding {encoding!r} is not base64 or utf-8")
        headers = env.get("headers")
        if not isinstance(headers, dict):
            raise DecodeError("headers are not a mapping")
        keep: dict[str, Any] = {k: props[k] for k in ("correlation_id", "reply_to", "delivery_mode",
                                      "delivery_info") if k in props}
        keep["priority"] = props.get("priority") or 0
        return (Message(headers, data, env.get("content-type") or "application/json",
                        env.get("content-encoding") or "utf-8", keep), env)
    except (orjson.JSONDecodeError, DecodeError, binascii.Error, TypeError,
            ValueError) as exc:
        reason = f"malformed kombu message envelope: {exc}"
        return Message({DECODE_ERROR_HEADER: reason}, raw, "application/data"), {}


def delivery_count(env: Mapping[str, Any]) -> int:
    headers = env.get("headers") if isinstance(env.get("headers"), dict) else {}
    assert isinstance(headers, dict)
    counted = headers.get(COUNT_HEADER)
    losses = counted if type(counted) is int and counted >= 0 else 0
    if not losses and headers.get("redelivered"):
        losses = 1  # restored by a kombu worker, which keeps no count
    return 1 + losses


def redelivered(raw: bytes, *, counted: bool) -> bytes:
    """The envelope as kombu restores it (``redelivered`` set in headers and
    delivery_info), with our loss count one higher when ``counted``."""
    try:
        env = orjson.loads(raw)
        headers = env["headers"]
        props = env["properties"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return raw  # unreadable: the consumer dead-letters it on its next delivery
    if counted:
        losses = delivery_count(env)  # this loss included: read before the flag is set
        headers["redelivered"] = True
        if isinstance(props.get("delivery_info"), dict):
            props["delivery_info"]["redelivered"] = True
        headers[COUNT_HEADER] = losses
    return orjson.dumps(env)



# -- dead letters (celeriac's; kombu has none) ----------------------------------------------
def dead_letters(client: redis.Redis, keys: Keys, limit: int) -> list[DeadLetter]:
    ids = [_text(i) for i in client.zrange(keys.dead_ids, 0, limit - 1)]
    records = client.hmget(keys.dead, ids) if ids else []
    out = []
    for dead_id, record in zip(ids, records, strict=True):
        if record is None:
            continue
        r = orjson.loads(record)
        message, _ = parse(r["raw"].encode())
        out.append(DeadLetter(int(dead_id), r["queue"], r["reason"], message,
                              int(r["count"]), float(r["at"])))
    return out


def requeue_dead(client: redis.Redis, keys: Keys, ids: Sequence[int | str]) -> int:
    moved = 0
    for dead_id in (str(i) for i in ids):
        record = client.hget(keys.dead, dead_id)
        if record is None:
            continue
        r = orjson.loads(record)
        env = orjson.loads(r["raw"])
        env.get("headers", {}).pop(COUNT_HEADER, None)  # a new delivery
        priority = int((env.get("properties") or {}).get("priority") or 0)
        pipe = client.pipeline(transaction=True)
        pipe.lpush(keys.list_key(r["queue"], priority), orjson.dumps(env))
        pipe.hdel(keys.dead, dead_id)
        pipe.zrem(keys.dead_ids, dead_id)
        pipe.execute()
        moved += 1
    return moved


def purge_dead(client: redis.Redis, keys: Keys, ids: Sequence[int | str] | None) -> int:
    chosen = [str(i) for i in ids] if ids is not None else \
        [_text(i) for i in client.zrange(keys.dead_ids, 0, -1)]
    if not chosen:
        return 0
    pipe = client.pipeline(transaction=True)
    pipe.hdel(keys.dead, *chosen)
    pipe.zrem(keys.dead_ids, *chosen)
    return int(pipe.execute()[0])


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

# Popping in Lua (RPOP and recording it in ``unacked`` in one step) leaves no moment
# where a message is neither in its list nor in ``unacked``. kombu's BRPOP has one: a
# worker that dies between the BRPOP reply and its HSET loses the message.
FETCH = script_source("kombu_fetch", prelude=None)

MOVE = script_source("kombu_move", prelude=None)

UNLOCK = script_source("kombu_unlock", prelude=None)
