"""Every kind of malformed message, made by hand with the brokers' own clients (redis-py
writing our key layout, pika publishing AMQP frames), sent to a real prefork worker on
Redis and on RabbitMQ. For each: it is dead-lettered with a reason and one log line, its
result is FAILURE where it carries an id (so ``get()`` raises at once), the worker stays
alive, and a good task sent behind it runs.

One worker per broker takes every case in turn (a worker start per case was most of this
module's time): each case looks at the dead letters and the log lines it added, and the
worker that goes on after one bad message goes on after all of them.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pika
import pytest
import redis

from celeriac import Celeriac
from celeriac.errors import CeleriacError
from celeriac.protocol import task_headers
from celeriac.testing import WorkerProcess, wait_until
from tests.contracts.conftest import _drop_amqp_namespace, _drop_redis_namespace
from tests.faults.brokers import AMQP_NAMES, pika_parameters
from tests.integration import app_tasks as t
from tests.integration.conftest import ROOT
from tests.services import require

pytestmark = pytest.mark.slow

ADD = "tests.integration.app_tasks.add"
LIMIT = 1024 * 1024
"""The worker's max_message_size here; producers in these tests have no such limit."""
ARGS = orjson.dumps([[1, 2], {}, {"callbacks": None, "errbacks": None, "chain": None,
                                  "chord": None}])


@dataclass
class Bad:
    """One malformed message: what to change in a good one, and the reason expected."""

    reason: str
    headers: dict[str, Any] = field(default_factory=dict)
    """Changes to a good message's headers; a value of ``...`` removes the header."""
    body: bytes = ARGS
    content_type: str | bytes = "application/json"
    priority: Any = 0
    raw_header_name: bytes | None = None
    """A header with this (non-UTF-8) name; Redis cannot carry it and gets bytes instead."""
    has_id: bool = True
    """Whether the worker can read the task id (and so store its FAILURE)."""
    brokers: tuple[str, ...] = ("redis", "amqp")
    raises: str = ""
    """What ``get()`` raises, if not the reason itself."""
    on_redis: dict[str, Any] = field(default_factory=dict)
    """Other expectations on Redis, whose JSON envelope cannot hold bytes that are not
    UTF-8: the whole envelope is unreadable there, the id with it."""


BROKEN_ENVELOPE = {"reason": "malformed message envelope: str is not valid UTF-8",
                   "has_id": False}


def _nested(depth: int) -> bytes:
    return b"[" + b"[" * depth + b"]" * depth + b",{},{}]"


CASES = {
    "bad-json": Bad("cannot decode application/json body", body=b"[[1, 2], {}, {"),
    "missing-task-header": Bad("missing or invalid 'task' header", headers={"task": ...}),
    "unknown-task": Bad("unknown task 'no.such.task'", headers={"task": "no.such.task"},
                        raises="task 'no.such.task' is not registered"),
    "wrong-content-type": Bad("content type 'application/x-yaml' is not accepted",
                              content_type="application/x-yaml"),
    "args-not-a-list": Bad("not a protocol v2 [args, kwargs, embed] triple",
                           body=orjson.dumps([{"x": 1}, {}, {}])),
    "kwargs-not-a-dict": Bad("not a protocol v2 [args, kwargs, embed] triple",
                             body=orjson.dumps([[1], [2], {}])),
    "oversized": Bad(f"over this worker's max_message_size={LIMIT}",
                     body=b"[[\"" + b"x" * (2 * LIMIT) + b"\", 1], {}, {}]"),
    "protocol-v1": Bad("not a protocol v2 task message",
                       headers={"task": ..., "id": ...}, has_id=False,
                       body=orjson.dumps({"task": ADD, "id": "v1", "args": [1, 2],
                                          "kwargs": {}})),
    "non-utf8-body": Bad("cannot decode application/json body",
                         body=b"[[\"\xff\xfe\", 2], {}, {}]"),
    "non-utf8-header-name": Bad("header name b'\\xff\\xfekey' is not UTF-8 text",
                                raw_header_name=b"\xff\xfekey", on_redis=BROKEN_ENVELOPE),
    "non-utf8-content-type": Bad("content type b'\\xffapplication/json' is not UTF-8 text",
                                 content_type=b"\xffapplication/json",
                                 on_redis=BROKEN_ENVELOPE),
    "missing-id": Bad("missing or invalid 'id' header", headers={"id": ...}, has_id=False),
    "eta-out-of-range": Bad("'eta' header 100000000000000000 (int) is not an ISO 8601 time",
                            headers={"eta": 10 ** 17}),
    "eta-not-a-time": Bad("'eta' header 'tomorrow' is not an ISO 8601 time",
                          headers={"eta": "tomorrow"}),
    "bad-expires": Bad("'expires' header 'never' is not an ISO 8601 time",
                       headers={"expires": "never"}),
    "bad-timelimit": Bad("'timelimit' header 5 (int) is not [hard, soft]",
                         headers={"timelimit": 5}),
    "negative-timelimit": Bad("'timelimit' header [-1, None] (list)",
                              headers={"timelimit": [-1, None]}),
    "bad-retries": Bad("'retries' header 'x' is not an integer", headers={"retries": "x"}),
    # AMQP's priority is an octet on the wire: no out-of-range value can be sent.
    "bad-priority": Bad("priority 300 (int) is not an integer from 0 to 255", priority=300,
                        brokers=("redis",)),
    "huge-nesting": Bad("cannot decode application/json body", body=_nested(100_000)),
}


def _headers(task_id: str, bad: Bad) -> dict[str, Any]:
    h = task_headers(task=ADD, task_id=task_id, args_repr="(1, 2)", kwargs_repr="{}")
    h["timelimit"] = [None, None]
    h.update(bad.headers)
    return {k: v for k, v in h.items() if v is not ...}


def publish_redis(url: str, task_id: str, bad: Bad) -> None:
    """Write the message in the Redis transport's key layout (clients/redis/lua/common.lua)."""
    ns = url.partition("namespace=")[2]
    headers = _headers(task_id, bad)
    ct = bad.content_type
    envelope = orjson.dumps({"h": headers, "p": {"correlation_id": task_id,
                                                 "priority": bad.priority},
                             "ct": ct if isinstance(ct, str) else "CT", "ce": "utf-8"})
    if isinstance(ct, bytes):  # JSON cannot hold these bytes: the envelope is broken
        envelope = envelope.replace(b'"CT"', b'"' + ct + b'"')
    if bad.raw_header_name is not None:
        envelope = envelope.replace(b'"h":{', b'"h":{"' + bad.raw_header_name + b'":1,')
    client = redis.Redis.from_url(require("redis"))
    try:
        mid = f"{client.incr(f'{ns}:seq'):016d}"
        client.hset(f"{ns}:m:{mid}", mapping={"q": "celery", "s": 9, "e": envelope,
                                              "b": bad.body})
        client.zadd(f"{ns}:q:celery", {mid: 9})
        for sleeper in client.smembers(f"{ns}:idle:celery"):
            client.rpush(f"{ns}:wake:{sleeper.decode()}", 1)
        client.delete(f"{ns}:idle:celery")
    finally:
        client.close()


def publish_amqp(url: str, task_id: str, bad: Bad) -> None:
    """Publish with pika, as any AMQP client could (it takes bytes for names and types)."""
    ns = url.partition("namespace=")[2]
    headers: dict[Any, Any] = _headers(task_id, bad)
    if bad.raw_header_name is not None:
        headers[bad.raw_header_name] = 1
    props = pika.BasicProperties(content_type=bad.content_type, content_encoding="utf-8",
                                 headers=headers, correlation_id=task_id,
                                 priority=bad.priority, delivery_mode=2)
    conn = pika.BlockingConnection(pika_parameters())
    try:
        conn.channel().basic_publish("", f"{ns}celery", bad.body, props)
    finally:
        conn.close()


@pytest.fixture(scope="module", params=["redis", "amqp"])
def env(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """``tests.faults.brokers.env`` for the module: one namespace per broker on the shared
    Redis or RabbitMQ (results on Redis), what the cases made deleted after the last."""
    ns = f"f{uuid.uuid4().hex[:12]}"
    results = f"{require('redis')}?namespace={ns}"
    broker = results if request.param == "redis" else f"{require('rabbitmq')}?namespace={ns}"
    yield {"CELERIAC_BROKER_URL": broker, "CELERIAC_RESULT_BACKEND": results,
           "CELERIAC_WORKER_LEASE_TIMEOUT": "1.0", "PYTHONPATH": str(ROOT)}
    _drop_redis_namespace(results)
    if request.param == "amqp":
        _drop_amqp_namespace(broker, AMQP_NAMES, AMQP_NAMES[:2])


@pytest.fixture(scope="module")
def worker(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[WorkerProcess]:
    """The real prefork worker every case of this broker is sent to."""
    w = WorkerProcess("tests.integration.app_tasks", "-c", "2",
                      env={**env, "CELERIAC_MAX_MESSAGE_SIZE": str(LIMIT)},
                      cwd=str(tmp_path_factory.mktemp("worker")))
    try:
        yield w.start()
    finally:
        w.kill()


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_message_is_dead_lettered_and_the_worker_goes_on(
        env: dict[str, str], app: Celeriac, worker: WorkerProcess, case: str) -> None:
    bad = CASES[case]
    broker = "redis" if env["CELERIAC_BROKER_URL"].startswith("redis") else "amqp"
    if broker == "redis":
        bad = dataclasses.replace(bad, **bad.on_redis)
    if broker not in bad.brokers:
        pytest.skip(f"{case} cannot be sent over {broker}")
    w = worker
    assert t.add.delay(0, 1).get(timeout=15) == 1  # declared its queue, up and running
    # What the cases before this one left: dead letters, and log lines (each case waited
    # for its own dead-letter line, so none of theirs comes after this mark).
    before = {d.id for d in app.transport.dead_letters(1000)}
    mark = len(w.log)
    task_id = f"bad-{uuid.uuid4()}"
    publish = publish_redis if broker == "redis" else publish_amqp
    publish(env["CELERIAC_BROKER_URL"], task_id, bad)
    good = t.add.delay(2, 2)
    assert good.get(timeout=15) == 4  # the good task behind it runs

    dead = wait_until(lambda: [d for d in app.transport.dead_letters(1000)
                               if d.id not in before], 10, message="a dead letter")
    assert len(dead) == 1, dead
    assert bad.reason in dead[0].reason, dead[0].reason
    assert dead[0].message.body == bad.body  # the original, byte for byte

    result = app.AsyncResult(task_id)
    if bad.has_id:
        assert result.state == "FAILURE"
        with pytest.raises(CeleriacError) as info:
            result.get(timeout=1)  # stored already: raises at once
        assert (bad.raises or bad.reason) in str(info.value), info.value
    else:
        assert result.state == "PENDING"

    assert w.proc is not None and w.proc.poll() is None
    # The worker's log reaches its file a moment after the broker saw the dead letter.
    wait_until(lambda: "dead-letter" in w.log[mark:], 10, message="the dead-letter log line")
    lines = [line for line in w.log[mark:].splitlines() if "dead-letter" in line]
    assert len(lines) == 1, w.log[mark:]
    assert "Traceback" not in w.log, w.log
