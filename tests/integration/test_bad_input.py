"""Bad input gets a clear error and loses nothing; the worker keeps running."""

from __future__ import annotations

import pickle
import zlib
from collections.abc import Callable

import orjson
import pytest

from celeriac import Celeriac, EncodeError, MessageTooLarge, Settings
from celeriac.protocol import Message, task_headers, task_properties
from celeriac.testing import WorkerProcess, wait_until
from tests.integration import app_tasks as t

pytestmark = pytest.mark.slow

ADD = "tests.integration.app_tasks.add"


def _message(body: bytes, content_type: str = "application/json", **headers: object) -> Message:
    h = task_headers(task=ADD, task_id="bad-1", args_repr="", kwargs_repr="")
    h.update(headers)
    return Message({k: v for k, v in h.items() if v is not ...}, body, content_type,
                   properties=task_properties("bad-1", 0))


def test_unencodable_argument_names_its_type_and_publishes_nothing(app: Celeriac) -> None:
    with pytest.raises(EncodeError, match=r"argument 1 has type set"):
        t.add.delay(1, {1, 2})  # type: ignore[arg-type]
    with pytest.raises(EncodeError, match=r"keyword argument 'y' has type object"):
        t.add.delay(1, y=object())  # type: ignore[arg-type]
    assert app.transport.queue_length("celery") == 0


def test_oversized_message_refused_at_publish(app: Celeriac) -> None:
    app.settings = app.settings.replace(max_message_size=1000)
    app.close()
    with pytest.raises(MessageTooLarge, match="over max_message_size=1000"):
        t.add.delay("x" * 2000, "y")  # type: ignore[arg-type]
    assert app.transport.queue_length("celery") == 0


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (_message(b"{not json"), "cannot decode application/json body"),
        (_message(orjson.dumps([[1, 2], {}, {}]), task=...), "missing or invalid 'task' header"),
        (_message(orjson.dumps([[1, 2], {}, {}]), task="no.such.task"), "unknown task"),
        (_message(pickle.dumps(((1, 2), {}, {})), "application/x-python-serialize"),
         "is not accepted"),
        (_message(orjson.dumps({"args": [1, 2]})), "not a protocol v2"),
        (_message(orjson.dumps([[1, 2], {}, {}]), compression="application/x-rar"),
         "'compression' header 'application/x-rar' is not a compression this worker can undo"),
        (_message(b"not zlib at all", compression="application/x-gzip"),
         "corrupt application/x-gzip data"),
        (_message(zlib.compress(orjson.dumps([[1, 2], {}, {}]))[:-4],
                  compression="application/x-gzip"), "application/x-gzip data is cut short"),
    ],
    ids=["invalid-json", "missing-task-header", "unknown-task", "pickle-not-accepted",
         "not-v2-body", "unknown-compression", "corrupt-compressed-body", "cut-compressed-body"],
)
def test_malformed_message_is_dead_lettered_and_worker_keeps_running(
        app: Celeriac, start_worker: Callable[..., WorkerProcess], message: Message,
        reason: str) -> None:
    w = start_worker()
    app.transport.publish("celery", message)
    dead = wait_until(app.transport.dead_letters, 10, message="a dead letter")
    assert len(dead) == 1
    assert reason in dead[0].reason
    assert dead[0].message.body == message.body  # the original, byte for byte
    assert t.add.delay(2, 2).get(timeout=10) == 4
    assert w.proc is not None and w.proc.poll() is None
    # The line is written after the dead letter is stored: on a loaded machine the test
    # may see the dead letter first.
    wait_until(lambda: "dead-letter" in w.log, 10, message="the dead-letter log line")
    assert len([line for line in w.log.splitlines() if "dead-letter" in line]) == 1


def test_a_body_that_expands_past_max_message_size_is_dead_lettered(
        app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    w = start_worker(extra_env={"CELERIAC_MAX_MESSAGE_SIZE": "100000"})
    # About 1 KB on the wire, 1 MB inside: refused before it is all in memory.
    bomb = zlib.compress(orjson.dumps([["a" * 1_000_000], {}, {}]))
    app.transport.publish("celery", _message(bomb, compression="application/x-gzip"))
    dead = wait_until(app.transport.dead_letters, 10, message="a dead letter")
    assert "expands past 100000 bytes" in dead[0].reason
    assert t.add.apply_async((2, 3), compression="bzip2").get(timeout=10) == 5
    assert w.proc is not None and w.proc.poll() is None


def test_pickle_accepted_only_when_opted_in(env: dict[str, str], app: Celeriac,
                                            start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker(extra_env={"CELERIAC_ACCEPT_CONTENT": "json,pickle"})
    app.settings = Settings.from_env({**env, "CELERIAC_ACCEPT_CONTENT": "json,pickle"})
    r = t.add.apply_async((3, 4), serializer="pickle")
    assert r.get(timeout=10) == 7


def test_unknown_broker_scheme_lists_known_schemes() -> None:
    from celeriac import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"unknown broker URL scheme 'kafka'.*sqlite://"):
        Celeriac(broker="kafka://localhost").transport  # noqa: B018
