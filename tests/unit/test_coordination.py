"""The shared store's arithmetic and leases on a fake clock (the memory store), store
selection from the app's URLs, and the worker's global limiter (``SharedTokens`` inside
``RateLimiter``) against a store on a fake clock."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from celeriac import Celeriac, Settings
from celeriac.errors import ConfigurationError
from celeriac.stores import batch_for, bucket_take, find_url, store_for, store_url
from celeriac.stores.memory import MemoryStore
from celeriac.stores.postgres import PostgresStore
from celeriac.stores.redis import RedisStore
from celeriac.stores.sqlite import SQLiteStore
from celeriac.worker.execute import Job
from celeriac.worker.ratelimit import RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_bucket_starts_full_grants_whole_tokens_and_says_how_long_to_wait() -> None:
    tokens, stamp, grant = bucket_take(5.0, 0.0, 0.0, 50.0, 5.0, 3)
    assert (grant.granted, grant.wait, tokens) == (3, 0.0, 2.0)
    tokens, stamp, grant = bucket_take(tokens, stamp, 0.0, 50.0, 5.0, 3)
    assert grant.granted == 2 and grant.wait == pytest.approx(0.02)  # 1 more at 50/s
    tokens, stamp, grant = bucket_take(tokens, stamp, 0.01, 50.0, 5.0, 5)
    assert grant.granted == 0 and tokens == pytest.approx(0.5)
    assert grant.wait == pytest.approx(4.5 / 50)  # the whole batch: not one token


def test_bucket_never_holds_more_than_its_capacity_and_ignores_a_clock_going_back() -> None:
    tokens, stamp, grant = bucket_take(0.0, 0.0, 3600.0, 50.0, 5.0, 100)
    assert grant.granted == 5 and tokens == 0.0  # an hour idle buys one batch only
    tokens, stamp, grant = bucket_take(tokens, stamp, 3500.0, 50.0, 5.0, 1)
    assert grant.granted == 0 and stamp == 3600.0


def test_over_any_window_grants_stay_within_rate_times_window_plus_capacity() -> None:
    tokens, stamp, granted, now = 5.0, 0.0, 0, 0.0
    while now < 10.0:  # greedy callers, every millisecond
        tokens, stamp, grant = bucket_take(tokens, stamp, now, 50.0, 5.0, 5)
        granted += grant.granted
        now += 0.001
    assert 500 <= granted <= 500 + 5


@pytest.mark.parametrize(("rate", "batch"), [(0.5, 1), (10, 1), (50, 5), (1000, 100),
                                             (1e6, 100)])
def test_batch_is_a_tenth_of_a_second_of_tokens_within_bounds(rate: float, batch: int) -> None:
    assert batch_for(rate) == batch


def test_lease_has_one_holder_until_it_expires_then_another_takes_over() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    assert store.acquire("beat", "w1", 2.0)
    assert not store.acquire("beat", "w2", 2.0)
    assert store.holder("beat") == "w1"
    clock.now += 1.5
    assert store.acquire("beat", "w1", 2.0)  # renewed: 2 s from now
    clock.now += 1.5
    assert not store.acquire("beat", "w2", 2.0)
    clock.now += 0.6  # w1 stopped renewing (killed): its lease ran out
    assert store.holder("beat") is None
    assert store.acquire("beat", "w2", 2.0)
    assert not store.acquire("beat", "w1", 2.0)


def test_release_frees_a_lease_only_for_its_holder() -> None:
    store = MemoryStore(clock=Clock())
    assert store.acquire("beat", "w1", 2.0)
    store.release("beat", "w2")
    assert store.holder("beat") == "w1"
    store.release("beat", "w1")
    assert store.acquire("beat", "w2", 2.0)


@pytest.mark.parametrize(("broker", "backend", "kind"), [
    ("redis://127.0.0.1:6379/0", None, RedisStore),
    ("sqlite:///x.db", None, SQLiteStore),
    ("amqp://guest@localhost//", "redis://127.0.0.1/1", RedisStore),
    ("amqp://guest@localhost//", "postgresql://u@localhost/db", PostgresStore),
    ("memory://coord", None, MemoryStore),
])
def test_store_is_the_broker_s_else_the_result_backend_s(
        broker: str, backend: str | None, kind: type[Any], tmp_path: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = store_for(Settings(broker_url=broker, result_backend=backend), "x")
    assert isinstance(store, kind)
    store.close()


@pytest.mark.parametrize(("broker", "backend", "chosen"), [
    ("redis://h/0", "postgresql://u@h/db", "postgresql://u@h/db"),  # the backend's first
    ("sqlite:///b.db", "redis://h/1", "redis://h/1"),
    ("redis://h/0", "memory://r", "redis://h/0"),  # a shared store before an in-process one
    ("memory://b", "memory://r", "memory://r"),
    ("redis+cluster://h:7000", "sqlite:///r.db", "sqlite:///r.db"),  # no Cluster store
    ("redis+sentinel://h:26379/0?master=m", None, "redis+sentinel://h:26379/0?master=m"),
    ("amqp://guest@localhost//", "rpc://", None),
])
def test_one_rule_picks_the_store_of_beat_limits_elections_and_revokes(
        broker: str, backend: str | None, chosen: str | None) -> None:
    settings = Settings(broker_url=broker, result_backend=backend)
    assert find_url(settings) == chosen
    if chosen is None:
        with pytest.raises(ConfigurationError, match="set result_backend"):
            store_url(settings)
    else:
        assert store_url(settings) == chosen


def test_rabbitmq_without_a_store_is_a_configuration_error_naming_the_task() -> None:
    app = Celeriac("t", broker="amqp://guest:secret@localhost//")

    @app.task(global_rate_limit="50/s")
    def metered() -> None: ...

    with pytest.raises(ConfigurationError) as info:
        RateLimiter(app, FakeTimer(), lambda: None)
    message = str(info.value)
    assert f"task {metered.name!r}: global_rate_limit" in message
    assert "secret" not in message and "postgresql://" in message


def test_bad_global_rate_limit_is_refused_at_registration_naming_it() -> None:
    app = Celeriac("t", broker="memory://bad")
    with pytest.raises(ConfigurationError, match="global_rate_limit: invalid rate limit"):
        app.task(global_rate_limit="fast")(lambda: None)


def test_task_annotations_can_set_a_global_rate_limit() -> None:
    app = Celeriac("t", broker="memory://ann",
                   task_annotations={"t.metered": {"global_rate_limit": "5/s"}})

    @app.task(name="t.metered")
    def metered() -> None: ...

    app.finalize()
    assert app.tasks["t.metered"].options.global_rate_limit == "5/s"


# -- the worker's side: SharedTokens in the RateLimiter ----------------------------------
class FakeTimer:
    def __init__(self) -> None:
        self.calls: list[tuple[float, Callable[..., Any], tuple[Any, ...]]] = []

    def call_after(self, delay: float, fn: Callable[..., Any], *args: Any) -> Any:
        self.calls.append((delay, fn, args))
        return SimpleNamespace(cancel=lambda: None)

    def fire_all(self) -> None:
        calls, self.calls = self.calls, []
        for _, fn, args in calls:
            fn(*args)


def job(seq: int, name: str) -> Job:
    return Job(seq, {"task": name, "id": f"id{seq}"}, b"", "application/json", "celery", 1,
               "w")


def test_limiter_takes_global_tokens_in_batches_and_holds_jobs_without_one() -> None:
    async def scenario() -> None:
        clock = Clock()
        app = Celeriac("t", broker="memory://limiter")

        @app.task(name="t.metered", global_rate_limit="50/s")
        def metered() -> None: ...

        timer, woken = FakeTimer(), []
        limiter = RateLimiter(app, timer, lambda: woken.append(1))
        limit = limiter.limits["t.metered"]
        assert limit is not None and limit.shared is not None and limit.bucket is None
        store = MemoryStore(clock=clock)
        limit.shared.store = store
        # No token cached: the first job is held and a batch is asked for.
        assert not limiter.admit(limit, job(1, "t.metered"))
        for seq in range(2, 8):
            assert not limiter.admit(limit, job(seq, "t.metered"))
        await wait_for(lambda: limit.shared is not None and not limit.shared.pending)
        assert limit.shared.tokens == 1  # the first request: one job held then
        timer.fire_all()  # its local wait (none): due
        assert woken and limiter.due
        reserved: deque[Job] = deque()
        limiter.release(reserved, room=10)
        assert [j.seq for j in reserved] == [1]
        # The rest: asked for in one batch of 5 (the bucket had 4 left, then refills).
        await wait_for(lambda: limit.shared is not None and not limit.shared.pending)
        assert limit.shared.asked == 2 and limit.shared.tokens == 4
        timer.fire_all()
        reserved.clear()
        limiter.release(reserved, room=10)
        assert [j.seq for j in reserved] == [2, 3, 4, 5]  # in order, one token each
        await wait_for(lambda: bool(timer.calls))  # the store said: wait
        assert timer.calls[0][0] == pytest.approx(2 / 50)  # the 2 held, at 50/s
        limiter.close()

    asyncio.run(scenario())


async def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.001)  # sleep-ok: yield to the loop
