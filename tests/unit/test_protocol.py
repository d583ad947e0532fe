from datetime import UTC, datetime

import orjson
import pytest

from celeriac import Celeriac, producer
from celeriac.protocol import (
    Message,
    parse_time,
    unpack,
    validate_headers,
    validate_properties,
)

V2_HEADERS = {"lang", "task", "id", "root_id", "parent_id", "group", "eta", "expires",
              "retries", "timelimit", "argsrepr", "kwargsrepr", "origin"}


def test_message_is_celery_protocol_v2() -> None:
    app = Celeriac("p", broker="memory://proto")
    msg, queue, delay = producer.build(app, "proj.add", (2, 3), {"z": 1}, producer.SendOptions(
        eta=datetime(2030, 1, 1, tzinfo=UTC), expires=60, priority=5, task_id="abc",
        time_limit=10, soft_time_limit=5))
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
    assert validate_headers({"id": "1"}) == (
        "missing or invalid 'task' header: none (not a protocol v2 task message)")
    assert validate_headers({"task": "t", "id": "1", "eta": "soon"}) is not None
    assert validate_headers({"task": "t", "id": "1", "retries": "x"}) is not None
    assert validate_headers([]) == "headers are not a mapping"


GOOD = {"task": "t", "id": "1", "eta": "2030-01-01T00:00:00+00:00", "expires": None,
        "retries": 2, "timelimit": [10, 5.5], "root_id": "1", "parent_id": None,
        "group": None, "group_index": None, "ignore_result": False, "argsrepr": "()",
        "kwargsrepr": "{}", "origin": "1@h", "lang": "py", "shadow": None,
        "x-unknown-extra": {"anything": [1, 2]}}


@pytest.mark.parametrize(("changes", "reason"), [
    ({"timelimit": 5}, "'timelimit' header 5 (int) is not [hard, soft]"),
    ({"timelimit": [1]}, "'timelimit' header [1] (list)"),
    ({"timelimit": ["1", None]}, "'timelimit' header"),
    ({"timelimit": [-1, None]}, "'timelimit' header"),
    ({"timelimit": [float("nan"), None]}, "'timelimit' header"),
    ({"timelimit": [1e300, None]}, "'timelimit' header"),
    ({"timelimit": [True, None]}, "'timelimit' header"),
    ({"eta": 10 ** 17}, "'eta' header 100000000000000000 (int) is not an ISO 8601 time"),
    ({"eta": "9999-99-99"}, "'eta' header '9999-99-99' is not an ISO 8601 time"),
    ({"expires": float("inf")}, "'expires' header inf (float)"),
    ({"expires": [1]}, "'expires' header [1] (list)"),
    ({"retries": -1}, "'retries' header -1 (int)"),
    ({"retries": True}, "'retries' header True (bool)"),
    ({"retries": 2 ** 40}, "'retries' header"),
    ({"id": ""}, "missing or invalid 'id' header: ''"),
    ({"id": 7}, "missing or invalid 'id' header: 7 (int)"),
    ({"id": "x" * 300}, "missing or invalid 'id' header"),
    ({"task": ""}, "missing or invalid 'task' header: ''"),
    ({"task": ["t"]}, "missing or invalid 'task' header: ['t'] (list)"),
    ({"root_id": 5}, "missing or invalid 'root_id' header: 5 (int)"),
    ({"group": {}}, "missing or invalid 'group' header"),
    ({"argsrepr": 1}, "'argsrepr' header 1 (int) is not a string"),
    ({"group_index": -2}, "'group_index' header -2 (int)"),
    ({"ignore_result": "yes"}, "'ignore_result' header 'yes' is not a boolean"),
    ({"\udcff\udcfekey": 1}, "header name b'\\xff\\xfekey' is not UTF-8 text"),
    ({7: 1}, "header name 7 (int) is not UTF-8 text"),
    ({"id": "\udcff"}, "missing or invalid 'id' header: b'\\xff'"),
])
def test_every_header_the_worker_reads_is_checked(changes: dict[str, object],
                                                   reason: str) -> None:
    assert validate_headers(GOOD) is None
    got = validate_headers({**GOOD, **changes})
    assert got is not None and got.startswith(reason), got


MALFORMED = test_every_header_the_worker_reads_is_checked.pytestmark[0].args[1]


def test_the_worker_checks_a_compact_message_by_its_kept_headers() -> None:
    """The worker validates what a compact envelope carried, not the defaults restored
    around it (``Admission.check``): the same verdict, for every header it reads."""
    plain = unpack(orjson.dumps([{"task": "t", "id": "1"}, {}]), b"")
    assert plain.kept is not None and plain.headers["retries"] == 0
    assert validate_headers(plain.headers) is None  # every default passes
    assert validate_headers(plain.kept[0]) is None
    carried = 0
    for changes, reason in MALFORMED:
        headers = {"task": "t", "id": "1", **changes}
        try:
            envelope = orjson.dumps([headers, {}])
        except TypeError:
            continue  # a name or text JSON cannot carry (checked above, as a dict)
        if orjson.loads(envelope)[0] != headers:
            continue  # NaN and infinity: JSON carries them as null
        message = unpack(envelope, b"")
        assert message.kept is not None
        got = validate_headers(message.kept[0])
        assert got == validate_headers(message.headers), changes
        assert got is not None and got.startswith(reason), got
        carried += 1
    assert carried >= 20


def test_a_whole_envelope_keeps_nothing_compact() -> None:
    whole = unpack(orjson.dumps([{"task": "t", "id": "1"}, {}, {"wh": 1}]), b"")
    assert whole.kept is None and "retries" not in whole.headers


def test_a_header_name_beyond_ascii_passes() -> None:
    assert validate_headers({**GOOD, "clé": 1, "名前": "x"}) is None


def test_content_type_and_priority_are_checked() -> None:
    good = Message(dict(GOOD), b"[]", properties={"priority": 9})
    assert validate_properties(good) is None
    for message, reason in [
        (Message({}, b"", "\udcffapplication/json"), "content type b'\\xffapplication/json'"),
        (Message({}, b"", properties={"priority": 300}), "priority 300 (int)"),
        (Message({}, b"", properties={"priority": "high"}), "priority 'high'"),
        (Message({}, b"", properties=[]), "properties are not a mapping"),  # type: ignore[arg-type]
    ]:
        got = validate_properties(message)
        assert got is not None and got.startswith(reason), got


def test_parse_time_never_raises() -> None:
    for value in (10 ** 17, -10 ** 17, float("nan"), float("inf"), "x", [], True, "9999-12-31"):
        parse_time(value)  # returns None or a datetime
    assert parse_time("2030-01-01T00:00:00") == datetime(2030, 1, 1, tzinfo=UTC)
