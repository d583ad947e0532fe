from datetime import UTC, datetime

import orjson

from celeriac import Celeriac
from celeriac.protocol import Message, validate_headers

V2_HEADERS = {"lang", "task", "id", "root_id", "parent_id", "group", "eta", "expires",
              "retries", "timelimit", "argsrepr", "kwargsrepr", "origin"}


def test_message_is_celery_protocol_v2() -> None:
    app = Celeriac("p", broker="memory://proto")
    msg, queue, delay = app._build(
        "proj.add", (2, 3), {"z": 1}, countdown=None, eta=datetime(2030, 1, 1, tzinfo=UTC),
        expires=60, queue=None, priority=5, task_id="abc", headers=None, serializer=None,
        retries=0, time_limit=10, soft_time_limit=5, ignore_result=False,
    )
    assert set(msg.headers) >= V2_HEADERS
    assert msg.headers["task"] == "proj.add" and msg.headers["id"] == "abc"
    assert msg.headers["root_id"] == "abc" and msg.headers["parent_id"] is None
    assert msg.headers["eta"] == "2030-01-01T00:00:00+00:00"
    assert msg.headers["timelimit"] == [10, 5]
    assert msg.headers["argsrepr"] == "(2, 3)"
    assert orjson.loads(msg.body) == [[2, 3], {"z": 1},
                                      {"callbacks": None, "errbacks": None, "chain": None,
                                       "chord": None}]
    assert msg.content_type == "application/json"
    assert msg.properties["correlation_id"] == "abc" and msg.priority == 5
    assert queue == "celery" and delay is not None and delay > 0


def test_envelope_round_trip_keeps_body_bytes() -> None:
    m = Message({"task": "t", "id": "1"}, b"\x00\xffraw", "application/x-msgpack", "binary",
                {"priority": 3})
    assert Message.from_envelope(m.envelope(), m.body) == m


def test_validate_headers_reasons() -> None:
    assert validate_headers({"task": "t", "id": "1"}) is None
    assert validate_headers({"id": "1"}) == "missing or invalid 'task' header"
    assert validate_headers({"task": "t", "id": "1", "eta": "soon"}) is not None
    assert validate_headers({"task": "t", "id": "1", "retries": "x"}) is not None
    assert validate_headers([]) == "headers are not a mapping"
