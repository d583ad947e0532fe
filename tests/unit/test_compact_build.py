"""A producer builds a message's compact parts (``protocol.kept_headers``) instead of
stripping the defaults from every header at publish: the message it sends must be the
same, header for header, as the whole set made then stripped, for every option."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from celeriac import Celeriac
from celeriac.hooks import Hooks
from celeriac.producer import builder
from celeriac.producer.options import SendOptions
from celeriac.protocol import Message, origin, pack, unpack

DEFAULTS: dict[str, Any] = {
    "lang": "py", "shadow": None, "eta": None, "expires": None, "group": None,
    "group_index": None, "retries": 0, "timelimit": [None, None], "parent_id": None,
    "argsrepr": "()", "kwargsrepr": "{}", "ignore_result": False,
}
"""Celery's protocol v2 headers at their defaults, as a producer wrote them before the
compact parts."""

# (args, kwargs, send options, the headers and properties that differ from the defaults)
CASES: list[tuple[tuple[Any, ...], dict[str, Any], dict[str, Any], dict[str, Any],
                  dict[str, Any]]] = [
    ((), {}, {}, {}, {}),
    ((1, "a"), {"k": [1]}, {}, {"argsrepr": "(1, 'a')", "kwargsrepr": "{'k': [1]}"}, {}),
    ((), {}, {"eta": datetime(2030, 1, 1, tzinfo=UTC)},
     {"eta": "2030-01-01T00:00:00+00:00"}, {}),
    ((), {}, {"expires": datetime(2031, 1, 1, tzinfo=UTC)},
     {"expires": "2031-01-01T00:00:00+00:00"}, {}),
    ((), {}, {"retries": 3, "time_limit": 10.0, "soft_time_limit": 5.0},
     {"retries": 3, "timelimit": [10.0, 5.0]}, {}),
    ((), {}, {"soft_time_limit": 5.0}, {"timelimit": [None, 5.0]}, {}),
    ((), {}, {"ignore_result": True}, {"ignore_result": True}, {}),
    ((), {}, {"priority": 7, "reply_to": "caller.q", "app_id": "web"}, {},
     {"priority": 7, "reply_to": "caller.q", "app_id": "web"}),
    ((), {}, {"headers": {"shadow": None, "argsrepr": "()", "x-custom": {"a": 1}}},
     {"x-custom": {"a": 1}}, {}),
    ((2,), {}, {"argsrepr": "()", "kwargsrepr": "{'secret': '***'}"},
     {"kwargsrepr": "{'secret': '***'}"}, {}),
    ((), {}, {"shadow": "alias", "group_id": "g1", "group_index": 0},
     {"shadow": "alias", "group": "g1", "group_index": 0}, {}),
    ((), {}, {"parent_id": "p1", "root_id": "r1"}, {"parent_id": "p1", "root_id": "r1"}, {}),
    ((), {}, {"task_id": "fixed-id", "root_id": "fixed-id"}, {"id": "fixed-id"}, {}),
    ((), {}, {"compression": "gzip"}, {"compression": "application/x-gzip"}, {}),
]


@pytest.fixture
def app() -> Celeriac:
    return Celeriac("compact", broker="memory://")


@pytest.mark.parametrize(("args", "kwargs", "options", "headers", "properties"), CASES)
def test_built_message_matches_the_whole_header_set(
        app: Celeriac, args: tuple[Any, ...], kwargs: dict[str, Any],
        options: dict[str, Any], headers: dict[str, Any], properties: dict[str, Any]) -> None:
    message, _, _ = builder.build(app, "t.compact", args, kwargs,
                                  SendOptions(**options).check())
    assert message.kept is not None
    task_id = message.headers["id"]
    expected = {**DEFAULTS, "task": "t.compact", "id": task_id, "root_id": task_id,
                "origin": origin(), **headers}
    assert message.headers == expected
    assert message.properties == {"correlation_id": task_id, "reply_to": None,
                                  "delivery_mode": 2, "priority": 0, **properties}
    # Packed from the kept parts, or from the whole set compared with the defaults: the
    # same envelope (key order aside) and body, and both unpack to the message sent.
    whole = Message(message.headers, message.body, message.content_type,
                    message.content_encoding, message.properties)
    (envelope, body), (envelope_whole, body_whole) = pack(message), pack(whole)
    assert orjson.loads(envelope) == orjson.loads(envelope_whole)
    assert body == body_whole
    assert unpack(*pack(message)) == whole


def test_hooks_see_a_message_whose_changes_are_sent(app: Celeriac) -> None:
    class Stamp(Hooks):
        def before_publish(self, message: Message, queue: str) -> None:
            message.headers["x-stamp"] = "seen"
            message.headers["retries"] = 2

    app.hooks.add(Stamp())
    message, _, _ = builder.build(app, "t.compact", (), {}, SendOptions())
    assert message.kept is None  # pack compares the headers anew
    app.hooks.call("before_publish", message, "celery")
    sent = unpack(*pack(message))
    assert sent.headers["x-stamp"] == "seen"
    assert sent.headers["retries"] == 2


@pytest.mark.parametrize(("args", "kwargs"), [
    ((1, "a", None, True, 2.5), {"b": 1, "a": "x"}),  # plain: repr, keys sorted as reprlib's
    ((10 ** 50,), {"big": 10 ** 50}),  # an int past reprlib's maxlong: cut
    (("x" * 300,), {"text": "y" * 300}),  # a string past maxstring: cut
    (("tab\there\x00", "é\u2028"), {"k": "\x00" * 100}),  # escapes that lengthen the repr
    (tuple(range(9)), {f"k{i}": i for i in range(9)}),  # more items than reprlib shows
    (([1, 2], {"n": {"deep": [1]}}), {1: "not a name"} | {"z": (1,)}),  # containers
])
def test_args_repr_reads_as_reprlib_would(args: tuple[Any, ...], kwargs: dict[Any, Any]
                                          ) -> None:
    """The producer's argsrepr and kwargsrepr: what reprlib gives (cut where it cuts),
    also where a fast path skips reprlib for plain values."""
    import reprlib

    from celeriac.runtime.request import args_repr

    ref = reprlib.Repr()
    ref.maxstring = ref.maxother = 256
    assert args_repr(args, kwargs) == (ref.repr(tuple(args)), ref.repr(dict(kwargs)))
