"""The shared store on each real service (Redis, PostgreSQL, the SQLite file): several
callers (threads, each with its own connection; on SQLite also another process) drain
one bucket and get ``rate x time + capacity`` tokens, no more and not much less; a lease
has one holder, is renewed by it, and is taken over once it runs out."""

from __future__ import annotations

import multiprocessing
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from celeriac import Settings
from celeriac.stores import SharedStore
from celeriac.stores.postgres import PostgresStore
from celeriac.stores.redis import RedisStore
from celeriac.stores.sqlite import SQLiteStore
from tests.contracts.conftest import _drop_redis_namespace
from tests.services import require

pytestmark = pytest.mark.slow

RATE, CAPACITY, SECONDS = 100.0, 10.0, 1.5


@pytest.fixture(params=["redis", "postgres", "sqlite"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path
               ) -> Iterator[Callable[[], SharedStore]]:
    ns = f"co{uuid.uuid4().hex[:10]}"
    made: list[SharedStore] = []
    if request.param == "redis":
        url = f"{require('redis')}?namespace={ns}"

        def make() -> SharedStore:
            made.append(RedisStore(url, Settings()))
            return made[-1]
    elif request.param == "postgres":
        url = f"{require('postgres')}?namespace={ns}"

        def make() -> SharedStore:
            made.append(PostgresStore(url))
            return made[-1]
    else:
        url = f"sqlite:///{tmp_path}/co.db"

        def make() -> SharedStore:
            made.append(SQLiteStore(url))
            return made[-1]
    yield make
    for store in made:
        store.close()
    if request.param == "redis":
        _drop_redis_namespace(url)
    elif request.param == "postgres":
        dropper = PostgresStore(url)
        dropper.drop()
        dropper.close()


def drain(store: SharedStore, until: float, out: list[int]) -> None:
    total = 0
    while time.monotonic() < until:
        grant = store.take("bucket", RATE, CAPACITY, 5)
        total += grant.granted
        if not grant.granted:
            # Never negative: the deadline may pass between the loop's test and here.
            pause = max(0.0, min(grant.wait, until - time.monotonic())) if grant.wait \
                else 0.001
            time.sleep(pause)  # sleep-ok: until the bucket grants the next token
    out.append(total)


def _drain_in_process(url: str, until_wall: float, queue: multiprocessing.Queue[int]) -> None:
    out: list[int] = []
    drain(SQLiteStore(url), time.monotonic() + (until_wall - time.time()), out)
    queue.put(out[0])


def test_callers_together_get_rate_times_time_plus_capacity(
        make_store: Callable[[], SharedStore]) -> None:
    first = make_store()
    # Each caller's connection made (and the store's tables) before the clock starts: on
    # a loaded machine that alone could take a good part of the window.
    callers = [make_store() for _ in range(4)]
    for store in callers:
        store.holder("warm-up")
    first.take("bucket", RATE, CAPACITY, 1)  # the bucket exists, full but one: t = 0
    start = time.monotonic()
    until = start + SECONDS
    totals: list[int] = []
    threads = [threading.Thread(target=drain, args=(store, until, totals))
               for store in callers]
    for thread in threads:
        thread.start()
    extra = None
    if isinstance(first, SQLiteStore):
        ctx = multiprocessing.get_context("spawn")
        queue: multiprocessing.Queue[int] = ctx.Queue()
        extra = ctx.Process(target=_drain_in_process,
                            args=(f"sqlite:///{first.db.path}", time.time() + SECONDS, queue))
        extra.start()
    for thread in threads:
        thread.join(SECONDS + 10)
    if extra is not None:
        totals.append(queue.get(timeout=30))
        extra.join(10)
    elapsed = time.monotonic() - start
    got = sum(totals)
    print(f"{type(first).__name__}: {got} tokens in {elapsed:.2f}s by {len(totals)} callers")
    assert got <= RATE * elapsed + CAPACITY
    assert got >= 0.9 * RATE * SECONDS


def test_lease_has_one_holder_and_passes_on_when_it_runs_out(
        make_store: Callable[[], SharedStore]) -> None:
    a, b = make_store(), make_store()
    assert a.acquire("leader", "a", 0.5)
    assert not b.acquire("leader", "b", 0.5)
    assert b.holder("leader") == "a"
    time.sleep(0.3)  # sleep-ok: time passes for the lease under test
    assert a.acquire("leader", "a", 0.5)  # renewed
    time.sleep(0.3)  # sleep-ok: time passes for the lease under test
    assert not b.acquire("leader", "b", 0.5)  # 0.6 s after the first, still a's
    deadline = time.monotonic() + 5
    while not b.acquire("leader", "b", 0.5):  # a stopped renewing
        assert time.monotonic() < deadline
        time.sleep(0.05)  # sleep-ok: time passes for the lease under test
    assert a.holder("leader") == "b"
    a.release("leader", "a")  # not a's any more: left alone
    assert a.holder("leader") == "b"
    b.release("leader", "b")
    assert a.holder("leader") is None
