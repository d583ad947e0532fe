import datetime
import decimal
import re
import uuid

import orjson
import pytest

from celeriac import Celeriac, ContentDisallowed, DecodeError, EncodeError
from celeriac.serialization import accepted_content_types, dumps, loads, markers, nesting

JSON_ONLY = accepted_content_types(("json",))


def test_json_round_trip_with_common_types() -> None:
    when = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    ct, data = dumps([1, "a", {"k": None}, when, uuid.UUID(int=1)])
    assert ct == "application/json"
    assert loads(data, ct, JSON_ONLY) == [1, "a", {"k": None}, when, uuid.UUID(int=1)]


def test_json_carries_what_kombu_s_json_carries_with_its_type_markers() -> None:
    # Celery's JSON (kombu.utils.json) writes these as {"__type__", "__value__"}: the
    # same bytes here, so each arrives as its own type on either side.
    values = {
        "datetime": datetime.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=datetime.UTC),
        "naive": datetime.datetime(2026, 1, 2, 3, 4, 5),
        "date": datetime.date(2026, 1, 2),
        "time": datetime.time(3, 4, 5),
        "decimal": decimal.Decimal("10.25"),
        "uuid": uuid.UUID(int=7),
        "bytes": b"caf\xc3\xa9",
        "binary": b"\xff\x00\x01",
        "nested": [(uuid.UUID(int=8), {"at": datetime.date(2026, 3, 4)})],
    }
    ct, data = dumps(values)
    doc = orjson.loads(data)
    assert doc["datetime"] == {"__type__": "datetime",
                               "__value__": "2026-01-02T03:04:05.000006+00:00"}
    assert doc["decimal"] == {"__type__": "decimal", "__value__": "10.25"}
    assert doc["uuid"] == {"__type__": "uuid", "__value__": {"hex": uuid.UUID(int=7).hex}}
    assert doc["bytes"] == {"__type__": "bytes", "__value__": "café"}
    assert doc["binary"] == {"__type__": "base64", "__value__": "/wAB"}
    back = loads(data, ct, JSON_ONLY)
    assert back == {**values, "nested": [[uuid.UUID(int=8), {"at": datetime.date(2026, 3, 4)}]]}


def test_a_value_without_markers_is_encoded_as_plain_json_and_not_copied() -> None:
    args = ([1, "a", {"k": [None, 2.5, True]}], {"x": "y"})
    assert markers.with_uuids(args) is args
    assert dumps(args)[1] == b'[[1,"a",{"k":[null,2.5,true]}],{"x":"y"}]'


def test_an_unknown_type_marker_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="unsupported JSON type marker 'frob'"):
        loads(b'{"__type__": "frob", "__value__": 1}', "application/json", JSON_ONLY)


def test_unencodable_type_is_encode_error() -> None:
    with pytest.raises(EncodeError, match="set"):
        dumps({1, 2})


def test_pickle_is_refused_unless_accepted() -> None:
    ct, data = dumps({"a": 1}, "pickle")
    with pytest.raises(ContentDisallowed, match="not accepted"):
        loads(data, ct, JSON_ONLY)
    assert loads(data, ct, accepted_content_types(("json", "pickle"))) == {"a": 1}


def test_msgpack_round_trip() -> None:
    ct, data = dumps([[1, 2], {"x": b"bytes"}], "msgpack")
    assert loads(data, ct, accepted_content_types(("msgpack",))) == [[1, 2], {"x": b"bytes"}]


def test_garbage_is_decode_error() -> None:
    with pytest.raises(DecodeError):
        loads(b"{nope", "application/json", JSON_ONLY)


def _nested(levels: int) -> list[object]:
    value: list[object] = []
    for _ in range(levels - 1):
        value = [value]
    return value


def test_nesting_counts_levels_iteratively_and_finds_cycles() -> None:
    assert nesting(5) == 0
    assert nesting([]) == 1
    assert nesting({"a": [1, {"b": ()}]}) == 4
    shared = [[1]]
    assert nesting([shared, shared, [shared]]) == 4
    assert nesting(_nested(100_000)) == 100_000  # no recursion
    loop: list[object] = []
    loop.append([loop])
    assert nesting(loop) is None


@pytest.mark.parametrize(("serializer", "limit"), [("json", 254), ("msgpack", 1025)])
def test_too_deep_says_so_at_the_serializers_limit(serializer: str, limit: int) -> None:
    dumps(_nested(limit), serializer)  # the limit itself encodes
    with pytest.raises(EncodeError, match=f"nested too deeply: over the {limit} levels of "
                                          f"lists and dicts the '{serializer}' serializer"):
        dumps(_nested(limit + 1), serializer)


def test_too_deep_for_pickle_names_the_recursion_limit() -> None:
    with pytest.raises(EncodeError, match="nested too deeply for Python's recursion limit"):
        dumps(_nested(10_000), "pickle")


def test_a_list_inside_itself_is_named() -> None:
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(EncodeError, match="a list or dict in it contains itself"):
        dumps(loop)


@pytest.mark.parametrize(
    ("serializer", "levels", "expected"),
    [
        ("json", 10_000, "argument 1 is nested too deeply: 10000 levels of lists and dicts, "
                         "over the 252 the 'json' serializer encodes in a task's argument"),
        # The body's own two levels push a 253-level argument past orjson's 254.
        ("json", 253, "argument 1 is nested too deeply: 253 levels"),
        ("msgpack", 10_000, "over the 1023 the 'msgpack' serializer encodes"),
        ("pickle", 10_000, "argument 1 is nested too deeply: 10000 levels of lists and "
                           "dicts, more than the 'pickle' serializer encodes within Python's"),
    ],
)
def test_an_argument_nested_too_deeply_is_named(memory_app: Celeriac, serializer: str,
                                                levels: int, expected: str) -> None:
    @memory_app.task
    def take(*args: object) -> None: ...

    with pytest.raises(EncodeError, match=re.escape(expected)) as raised:
        take.apply_async((1, _nested(levels)), serializer=serializer)
    assert "has type list" not in str(raised.value)
    assert str(raised.value).endswith("nothing was published")
    assert memory_app.transport.queue_length("celery") == 0


def test_an_argument_inside_itself_is_named(memory_app: Celeriac) -> None:
    @memory_app.task
    def take(**kwargs: object) -> None: ...

    loop: dict[str, object] = {}
    loop["me"] = loop
    with pytest.raises(EncodeError, match="keyword argument 'x' contains itself"):
        take.delay(x=loop)
