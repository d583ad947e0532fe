"""Rate limits: Celery's syntax, the token bucket's timing (an injected clock), the
limiter's holding and releasing (a fake timer), and the consumer's hook on the memory
broker: order within a task name, others not held back, held messages given back."""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Callable, Iterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from celeriac import Celeriac, states
from celeriac.errors import ConfigurationError
from celeriac.protocol import utcnow
from celeriac.testing import ThreadedWorker, wait_until
from celeriac.worker.execute import Job
from celeriac.worker.ratelimit import HOLD_FACTOR, RateLimiter, TokenBucket, parse_rate


@pytest.mark.parametrize(("value", "expected"), [
    (10, 10.0), (2.5, 2.5), ("10", 10.0), ("10/s", 10.0), ("10/", 10.0), ("30/m", 0.5),
    ("3600/h", 1.0), (" 6 / m ", 0.1), ("1.5/s", 1.5), (None, None), (0, None),
    (0.0, None), ("0", None), ("0/m", None),
])
def test_parse_rate_accepts_celerys_forms(value: Any, expected: float | None) -> None:
    assert parse_rate(value) == pytest.approx(expected)


@pytest.mark.parametrize("value", [
    "10/x", "10/min", "ten/s", "", "/s", "10/s/s", -1, "-5/m", "nan", "inf", "1e400/s",
    float("inf"), True, [10], b"10/s",
])
def test_parse_rate_refuses_anything_else_naming_the_value(value: Any) -> None:
    with pytest.raises(ValueError) as info:
        parse_rate(value)
    message = str(info.value)
    assert repr(value) in message
    assert '"N/s", "N/m" or "N/h"' in message and "None or 0 for no limit" in message


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_bucket_starts_full_and_refills_at_its_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(10.0, clock=clock)
    assert bucket.can_consume()
    assert not bucket.can_consume()
    assert bucket.expected_time() == pytest.approx(0.1)
    clock.now += 0.04
    assert not bucket.can_consume()
    assert bucket.expected_time() == pytest.approx(0.06)
    clock.now += 0.06
    assert bucket.expected_time() == 0.0
    assert bucket.can_consume()
    assert not bucket.can_consume()


def test_bucket_of_capacity_one_never_bursts_after_idling() -> None:
    clock = Clock()
    bucket = TokenBucket(10.0, clock=clock)
    assert bucket.can_consume()
    clock.now += 60.0
    assert bucket.can_consume()
    assert not bucket.can_consume()  # a minute idle still buys one start, not 600
    assert bucket.expected_time() == pytest.approx(0.1)


def test_bucket_set_rate_keeps_what_accrued() -> None:
    clock = Clock()
    bucket = TokenBucket(1.0, clock=clock)
    assert bucket.can_consume()
    clock.now += 0.5  # half a token at 1/s
    bucket.set_rate(10.0)
    assert bucket.expected_time() == pytest.approx(0.05)
    with pytest.raises(ValueError):
        bucket.set_rate(0.0)
    with pytest.raises(ValueError):
        TokenBucket(0.0)


# -- the limiter, with a fake timer ---------------------------------------------------
class Entry:
    def __init__(self, delay: float, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.delay, self.fn, self.args, self.cancelled = delay, fn, args, False

    def cancel(self) -> None:
        self.cancelled = True


class FakeTimer:
    def __init__(self) -> None:
        self.entries: list[Entry] = []

    def call_after(self, delay: float, fn: Callable[..., Any], *args: Any) -> Entry:
        entry = Entry(delay, fn, args)
        self.entries.append(entry)
        return entry

    def pending(self) -> list[Entry]:
        return [e for e in self.entries if not e.cancelled and not getattr(e, "fired", 0)]

    def fire(self) -> None:
        for e in self.pending():
            e.fired = True  # type: ignore[attr-defined]
            e.fn(*e.args)


def fake_app(default: str | float | None = None, disabled: bool = False,
             **limits: str | float | None) -> Any:
    tasks = {name: SimpleNamespace(options=SimpleNamespace(rate_limit=rate))
             for name, rate in {"free": None, **limits}.items()}
    settings = SimpleNamespace(task_default_rate_limit=default,
                               worker_disable_rate_limits=disabled)
    return SimpleNamespace(settings=settings, tasks=tasks)


seqs = iter(range(1, 1_000_000))


def job(name: str, **headers: Any) -> Job:
    return Job(next(seqs), {"task": name, "id": f"{name}-{uuid.uuid4().hex[:6]}", **headers},
               b"", "application/json", "celery", 1, "test")


@pytest.fixture
def clock() -> Clock:
    return Clock()


def limiter_for(app: Any, clock: Clock, timer: FakeTimer | None = None,
                wakes: list[int] | None = None) -> RateLimiter:
    woken = wakes if wakes is not None else []
    return RateLimiter(app, timer or FakeTimer(), lambda: woken.append(1), clock=clock)


def test_limits_come_from_the_option_else_the_default(clock: Clock) -> None:
    limiter = limiter_for(fake_app(default="60/m", slow="2/s", off=0), clock)
    assert limiter.limits["free"] is not None  # the default applies to it
    assert limiter.limits["free"].bucket.rate == 1.0  # type: ignore[union-attr]
    assert limiter.limits["slow"].bucket.rate == 2.0  # type: ignore[union-attr]
    assert limiter.limits["off"] is limiter.limits["unknown"] is None
    assert limiter_for(fake_app(slow="2/s"), clock).limits["free"] is None


def test_disabled_rate_limits_limit_nothing(clock: Clock) -> None:
    limiter = limiter_for(fake_app(default="1/s", disabled=True, slow="2/s", bad="x"), clock)
    assert limiter.limits["slow"] is limiter.limits["free"] is None
    assert limiter.set_rate("slow", "5/s") is None and limiter.limits["slow"] is None


def test_a_bad_limit_stops_the_worker_at_start_naming_the_task(clock: Clock) -> None:
    with pytest.raises(ConfigurationError, match=r"task 'slow': invalid rate limit '10/x'"):
        limiter_for(fake_app(slow="10/x"), clock)
    with pytest.raises(ConfigurationError, match=r"task_default_rate_limit: invalid rate"):
        limiter_for(fake_app(default="fast"), clock)


def test_held_jobs_keep_their_order_and_leave_one_per_token(clock: Clock) -> None:
    timer, wakes = FakeTimer(), []
    limiter = limiter_for(fake_app(slow="10/s"), clock, timer, wakes)
    slow = limiter.limits["slow"]
    assert slow is not None
    a, b, c = job("slow"), job("slow"), job("slow")
    assert limiter.admit(slow, a)  # the bucket starts full
    assert not limiter.admit(slow, b) and not limiter.admit(slow, c)
    assert limiter.held == 2 and list(slow.held) == [b, c]
    [entry] = timer.pending()
    assert entry.delay == pytest.approx(0.1)
    clock.now += 0.1
    timer.fire()
    assert wakes == [1] and slow in limiter.due
    reserved: deque[Job] = deque([job("free")])
    assert limiter.release(reserved, room=5) == []
    assert reserved[0] is b and len(reserved) == 2 and limiter.held == 1  # one token, one job
    assert limiter.admit(slow, b)  # it holds its token already
    assert not limiter.due and len(timer.pending()) == 1  # c waits for the next token
    d = job("slow")
    clock.now += 0.1  # a token is there, but c came first
    assert not limiter.admit(slow, d)
    assert list(slow.held) == [c, d]
    timer.fire()
    reserved.clear()
    limiter.release(reserved, room=5)
    assert list(reserved) == [c]


def test_a_due_job_without_room_in_the_pool_waits_for_a_slot(clock: Clock) -> None:
    timer = FakeTimer()
    limiter = limiter_for(fake_app(slow="10/s"), clock, timer)
    slow = limiter.limits["slow"]
    assert slow is not None
    limiter.admit(slow, job("slow"))
    held = job("slow")
    limiter.admit(slow, held)
    clock.now += 1.0
    timer.fire()
    reserved: deque[Job] = deque()
    limiter.release(reserved, room=0)
    assert not reserved and slow in limiter.due and not timer.pending()
    limiter.release(reserved, room=1)  # a slot freed
    assert list(reserved) == [held] and not limiter.due


def test_an_expired_held_job_is_handed_back_without_a_token(clock: Clock) -> None:
    timer = FakeTimer()
    limiter = limiter_for(fake_app(slow="10/s"), clock, timer)
    slow = limiter.limits["slow"]
    assert slow is not None
    limiter.admit(slow, job("slow"))
    gone = job("slow", expires=(utcnow() - timedelta(seconds=1)).isoformat())
    fine = job("slow", expires=(utcnow() + timedelta(hours=1)).isoformat())
    limiter.admit(slow, gone)
    limiter.admit(slow, fine)
    clock.now += 0.1
    timer.fire()
    reserved: deque[Job] = deque()
    assert limiter.release(reserved, room=5) == [gone]
    assert list(reserved) == [fine] and limiter.held == 0


def test_set_rate_at_runtime(clock: Clock) -> None:
    timer = FakeTimer()
    limiter = limiter_for(fake_app(slow="1/s"), clock, timer)
    slow = limiter.limits["slow"]
    assert slow is not None
    limiter.admit(slow, job("slow"))
    held = [job("slow"), job("slow")]
    for j in held:
        limiter.admit(slow, j)
    assert timer.pending()[0].delay == pytest.approx(1.0)
    assert limiter.set_rate("slow", "10/s") == 10.0
    [entry] = timer.pending()  # the wait was computed again at the new rate
    assert entry.delay == pytest.approx(0.1)
    assert limiter.set_rate("slow", None) is None  # lifted: held jobs leave untimed
    assert limiter.limits["slow"] is None
    timer.fire()
    reserved: deque[Job] = deque()
    limiter.release(reserved, room=5)
    assert list(reserved) == held and limiter.held == 0
    assert limiter.set_rate("free", 2) == 2.0  # an unlimited task gets a limit
    free = limiter.limits["free"]
    assert free is not None and limiter.admit(free, job("free"))
    assert not limiter.admit(free, job("free"))
    with pytest.raises(KeyError, match="unknown task 'nope'"):
        limiter.set_rate("nope", 1)
    with pytest.raises(ValueError, match="invalid rate limit"):
        limiter.set_rate("slow", "1/fortnight")


def test_drain_takes_every_held_job_and_disarms_the_timer(clock: Clock) -> None:
    timer = FakeTimer()
    limiter = limiter_for(fake_app(a="1/s", b="1/h"), clock, timer)
    la, lb = limiter.limits["a"], limiter.limits["b"]
    assert la is not None and lb is not None
    limiter.admit(la, job("a"))
    limiter.admit(lb, job("b"))
    held = [job("a"), job("b"), job("a")]
    for j in held:
        limiter.admit(la if j.headers["task"] == "a" else lb, j)
    assert limiter.budget_exempt(10) == 3
    assert limiter.budget_exempt(0) == 0 and HOLD_FACTOR > 1
    assert sorted(j.seq for j in limiter.drain()) == sorted(j.seq for j in held)
    assert limiter.held == 0 and not timer.pending() and not limiter.due


# -- the consumer's hook, on the memory broker ----------------------------------------
@pytest.fixture
def app() -> Iterator[Celeriac]:
    url = f"memory://{uuid.uuid4().hex}"
    app = Celeriac("t", broker=url, backend=url, worker_lease_timeout=2.0)
    yield app
    app.close()


def test_limited_task_keeps_its_order_and_does_not_hold_others_back(app: Celeriac) -> None:
    order: list[tuple[str, int]] = []

    @app.task(name="t.slow", rate_limit="20/s")
    def slow(i: int) -> None:
        order.append(("slow", i))

    @app.task(name="t.free")
    def free(i: int) -> None:
        order.append(("free", i))

    slows = slow.delay_many([(i,) for i in range(6)])
    frees = free.delay_many([(i,) for i in range(6)])
    with ThreadedWorker(app):
        for r in frees:
            r.get(timeout=5)
        assert sum(1 for kind, _ in order if kind == "slow") < 6  # frees did not wait
        for r in slows:
            r.get(timeout=5)
    assert [i for kind, i in order if kind == "slow"] == list(range(6))


def test_warm_stop_gives_held_messages_back(app: Celeriac) -> None:
    @app.task(name="t.slow", rate_limit="2/s")
    def slow() -> None:
        pass

    results = slow.delay_many([() for _ in range(6)])
    worker = ThreadedWorker(app).start()
    wait_until(lambda: results[0].state == states.SUCCESS, 5)
    worker.stop()
    assert worker.exit_code == 0
    done = sum(1 for r in results if r.state == states.SUCCESS)
    assert done < 6
    assert app.transport.queue_length("celery") == 6 - done  # none lost, none run twice
