"""The Redis result backend's ``get()`` path: a thread that waited a moment ago starts
its next wait from where it stopped, when that position was taken before the task was
sent (``wait_for``'s ``since``), in one round trip (XREAD and MGET), instead of first
reading a new position. Results sent before the position, or a position gone stale,
take the full path. Each test uses its own namespace on the shared Redis."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from celeriac import states
from celeriac.backends import redis as redis_backend
from celeriac.backends.redis import RedisBackend
from celeriac.settings import Settings
from tests.contracts import redis_support

ns, url = redis_support.ns, redis_support.url


@pytest.fixture
def backends(url: str) -> Iterator[tuple[RedisBackend, RedisBackend]]:
    """The caller's backend (its commands recorded in ``.sent``) and the worker's."""
    caller = RedisBackend(url, Settings(result_backend=url))
    worker = RedisBackend(url, Settings(result_backend=url))
    sent: list[str] = []
    real = caller._lane

    def recording(build: Any, **kw: Any) -> Any:
        sent.extend(str(command[0]) for command in build(caller.conn.endpoint.namespace))
        return real(build, **kw)

    caller._lane = recording  # type: ignore[method-assign]
    caller.sent = sent  # type: ignore[attr-defined]
    yield caller, worker
    caller.close()
    worker.close()


def _settle_position(caller: RedisBackend, worker: RedisBackend) -> None:
    """A get() that returned: the caller's thread now has a fresh wait position."""
    worker.store("before", states.SUCCESS, 0)
    assert caller.wait_for(["before"], 5.0)["before"].result == 0


def test_a_wait_right_after_another_starts_from_its_position(
        backends: tuple[RedisBackend, RedisBackend]) -> None:
    caller, worker = backends
    _settle_position(caller, worker)
    caller.sent.clear()  # type: ignore[attr-defined]
    since = time.monotonic()  # the task is sent now, after the position was taken
    worker.store("after", states.SUCCESS, 1)
    assert caller.wait_for(["after"], 5.0, since=since)["after"].result == 1
    assert caller.sent == ["XREAD", "MGET"]  # type: ignore[attr-defined]


def test_a_result_sent_before_the_position_is_read_as_before(
        backends: tuple[RedisBackend, RedisBackend]) -> None:
    """r1, r2 sent, then r1.get(): r2's result may be older than r1's wait position,
    so r2.get() takes a new one and reads at once (it does not sleep in XREAD)."""
    caller, worker = backends
    since = time.monotonic()  # sent before the position below
    worker.store("early", states.SUCCESS, 2)
    _settle_position(caller, worker)
    caller.sent.clear()  # type: ignore[attr-defined]
    began = time.monotonic()
    assert caller.wait_for(["early"], 5.0, since=since)["early"].result == 2
    assert caller.sent[:2] == ["XREVRANGE", "MGET"]  # type: ignore[attr-defined]
    assert time.monotonic() - began < 0.9  # not after a 1 s XREAD BLOCK


def test_a_stale_position_is_not_started_from(
        backends: tuple[RedisBackend, RedisBackend], monkeypatch: pytest.MonkeyPatch) -> None:
    caller, worker = backends
    _settle_position(caller, worker)
    monkeypatch.setattr(redis_backend, "POSITION_FRESH", 0.0)  # every position is stale
    caller.sent.clear()  # type: ignore[attr-defined]
    since = time.monotonic()
    worker.store("later", states.SUCCESS, 3)
    assert caller.wait_for(["later"], 5.0, since=since)["later"].result == 3
    assert caller.sent[:2] == ["XREVRANGE", "MGET"]  # type: ignore[attr-defined]
