import datetime
import uuid

import pytest

from celeriac import ContentDisallowed, DecodeError, EncodeError
from celeriac.serialization import accepted_content_types, dumps, loads

JSON_ONLY = accepted_content_types(("json",))


def test_json_round_trip_with_common_types() -> None:
    when = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    ct, data = dumps([1, "a", {"k": None}, when, uuid.UUID(int=1)])
    assert ct == "application/json"
    assert loads(data, ct, JSON_ONLY) == [1, "a", {"k": None}, when.isoformat(),
                                          str(uuid.UUID(int=1))]


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
