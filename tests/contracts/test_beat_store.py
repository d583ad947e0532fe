"""The beat store contract: every store (memory, Redis, PostgreSQL, SQLite) passes it."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from celeriac.beat.store import BeatStore, open_store
from celeriac.settings import Settings
from celeriac.testing import wait_until
from tests.contracts.conftest import _drop_redis_namespace, _namespaced

STORE_URLS: dict[str, Callable[[Path], str]] = {
    "memory": lambda tmp: f"memory://{uuid.uuid4().hex}",
    "sqlite": lambda tmp: f"sqlite:///{tmp / 'beat.db'}",
    "redis": _namespaced("redis"),
    "postgres": _namespaced("postgres"),
}


class Stores:
    def __init__(self, url: str) -> None:
        self.url = url
        self.made: list[BeatStore] = []

    def __call__(self) -> BeatStore:
        store = open_store(Settings(result_backend=self.url), self.url)
        self.made.append(store)
        return store


@pytest.fixture(params=sorted(STORE_URLS))
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    factory = Stores(STORE_URLS[request.param](tmp_path))
    yield factory
    if request.param == "postgres":
        factory().drop()  # type: ignore[attr-defined]
    for store in factory.made:
        store.close()
    if request.param == "redis":
        _drop_redis_namespace(factory.url)


def test_lease_is_exclusive_and_renewable(stores: Stores) -> None:
    a, b = stores(), stores()
    assert a.acquire("a", 5.0)
    assert not b.acquire("b", 5.0)
    assert a.acquire("a", 5.0)  # renewal
    lease = b.leader()
    assert lease is not None and lease.holder == "a"
    assert lease.expires > time.time() + 3


def test_released_lease_is_free(stores: Stores) -> None:
    a = stores()
    assert a.acquire("a", 5.0)
    a.release("b")  # not b's to release
    assert not a.acquire("b", 5.0)
    a.release("a")
    assert a.leader() is None
    assert a.acquire("b", 5.0)


@pytest.mark.slow
def test_lease_expires(stores: Stores) -> None:
    a = stores()
    assert a.acquire("a", 0.3)
    wait_until(lambda: a.acquire("b", 5.0), 5, 0.05, message="the lease lapsed")
    assert a.leader().holder == "b"  # type: ignore[union-attr]


def test_claim_once_and_only_by_the_holder(stores: Stores) -> None:
    s = stores()
    assert not s.claim("a", "e", 1000)  # no lease
    assert s.acquire("a", 5.0)
    assert s.claim("a", "e", 1000)
    assert not s.claim("a", "e", 1000)  # the same due time
    assert not s.claim("a", "e", 900)  # an earlier one
    assert not s.claim("b", "e", 2000)  # not the holder
    assert s.claim("a", "e", 2000)
    assert s.claim("a", "other", 1000)
    assert s.last_runs() == {"e": 2000, "other": 1000}
    assert [r.key for r in s.runs()] == ["other@1000", "e@2000", "e@1000"]
    assert {r.holder for r in s.runs()} == {"a"}


def test_advance_moves_last_without_a_run(stores: Stores) -> None:
    s = stores()
    assert s.acquire("a", 5.0)
    assert s.advance("a", "e", 5000)
    assert not s.advance("a", "e", 5000)
    assert not s.claim("a", "e", 4000)
    assert s.runs() == []
    assert s.last_runs() == {"e": 5000}


def test_concurrent_claims_one_wins(stores: Stores) -> None:
    s = stores()
    assert s.acquire("a", 30.0)
    clients = [stores() for _ in range(4)]
    wins: list[bool] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(clients))

    def claim(store: BeatStore) -> None:
        barrier.wait()
        for due in range(10):
            won = store.claim("a", "e", 1000 + due)
            with lock:
                wins.append(won)

    threads = [threading.Thread(target=claim, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sum(wins) <= 10
    keys = [r.key for r in s.runs()]
    assert len(keys) == len(set(keys)) == sum(wins)


def test_entries_crud(stores: Stores) -> None:
    s, other = stores(), stores()
    s.put_entry("a", b'{"x": 1}')
    s.put_entry("b", b'{"y": 2}')
    s.put_entry("a", b'{"x": 3}')
    assert other.entries() == {"a": b'{"x": 3}', "b": b'{"y": 2}'}
    assert s.acquire("h", 5.0) and s.claim("h", "a", 10)
    assert other.remove_entry("a")
    assert not other.remove_entry("a")
    assert s.entries() == {"b": b'{"y": 2}'}
    assert "a" not in s.last_runs()
