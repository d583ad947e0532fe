"""The shared store contract (``celeriac.stores``): every store (memory, SQLite, Redis,
PostgreSQL) passes the same assertions on its leases, token buckets, beat's run keys and
entries, and revoked ids. Each test has its own store: a unique memory name, a
temporary file, a unique namespace (key or table prefix) on the shared servers."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from celeriac.settings import Settings
from celeriac.stores import BEAT_LEASE as BEAT
from celeriac.stores import STORES, SharedStore, find_url, open_store
from celeriac.testing import wait_until
from tests.contracts.conftest import _drop_redis_namespace, _namespaced

STORE_URLS: dict[str, Callable[[Path], str]] = {
    "memory": lambda tmp: f"memory://{uuid.uuid4().hex}",
    "sqlite": lambda tmp: f"sqlite:///{tmp / 'store.db'}",
    "redis": _namespaced("redis"),
    "postgres": _namespaced("postgres"),
}


class Stores:
    """Makes stores (each with connections of its own) on one test's store URL."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.made: list[SharedStore] = []

    def __call__(self) -> SharedStore:
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


def test_the_store_is_the_result_backend_s_and_one_class_per_service(stores: Stores) -> None:
    store = stores()
    assert type(store) is STORES.lookup(stores.url)
    assert find_url(Settings(broker_url="amqp://guest@localhost//",
                             result_backend=stores.url)) == stores.url
    assert isinstance(store, SharedStore)  # one interface, beat's and every other user's


# -- leases ---------------------------------------------------------------------------
def test_lease_has_one_holder_is_renewed_and_released_only_by_it(stores: Stores) -> None:
    a, b = stores(), stores()
    assert a.acquire("leader", "a", 5.0)
    assert not b.acquire("leader", "b", 5.0)
    assert a.acquire("leader", "a", 5.0)  # renewal
    lease = b.lease("leader")
    assert lease is not None and lease.holder == "a" and b.holder("leader") == "a"
    assert lease.expires > time.time() + 3
    assert b.acquire("other", "b", 5.0)  # leases are independent by name
    b.release("leader", "b")  # not b's: left alone
    assert a.holder("leader") == "a"
    a.release("leader", "a")
    assert b.lease("leader") is None and b.holder("leader") is None
    assert b.acquire("leader", "b", 5.0)
    assert a.holder("other") == "b"


@pytest.mark.slow
def test_lease_passes_on_when_it_runs_out(stores: Stores) -> None:
    a, b = stores(), stores()
    assert a.acquire("leader", "a", 0.3)
    wait_until(lambda: b.acquire("leader", "b", 5.0), 5, 0.05, message="the lease lapsed")
    assert a.holder("leader") == "b"
    assert not a.acquire("leader", "a", 5.0)


# -- token buckets --------------------------------------------------------------------
def test_bucket_starts_full_grants_whole_tokens_then_says_how_long_to_wait(
        stores: Stores) -> None:
    a, b = stores(), stores()
    # 0.5 tokens a second: what accrues while the test runs is well under one token.
    first = a.take("bucket", 0.5, 5.0, 3)
    assert (first.granted, first.wait) == (3, 0.0)
    second = b.take("bucket", 0.5, 5.0, 3)  # another client, the same bucket
    assert second.granted == 2 and 0 < second.wait <= 2.0
    third = a.take("bucket", 0.5, 5.0, 1)
    assert third.granted == 0 and 0 < third.wait <= 2.0
    assert a.take("other", 0.5, 5.0, 5).granted == 5  # buckets are independent by name
    with pytest.raises(ValueError, match="rate > 0"):
        a.take("bucket", 0.0, 5.0, 1)


# -- beat: run keys and entries (the beat lease fences claims) ------------------------
def test_beat_lease_is_exclusive_and_renewable(stores: Stores) -> None:
    a, b = stores(), stores()
    assert a.acquire(BEAT, "a", 5.0)
    assert not b.acquire(BEAT, "b", 5.0)
    assert a.acquire(BEAT, "a", 5.0)  # renewal
    lease = b.leader()
    assert lease is not None and lease.holder == "a"
    assert lease.expires > time.time() + 3


def test_released_beat_lease_is_free(stores: Stores) -> None:
    a = stores()
    assert a.acquire(BEAT, "a", 5.0)
    a.release(BEAT, "b")  # not b's to release
    assert not a.acquire(BEAT, "b", 5.0)
    a.release(BEAT, "a")
    assert a.leader() is None
    assert a.acquire(BEAT, "b", 5.0)


@pytest.mark.slow
def test_beat_lease_expires(stores: Stores) -> None:
    a = stores()
    assert a.acquire(BEAT, "a", 0.3)
    wait_until(lambda: a.acquire(BEAT, "b", 5.0), 5, 0.05, message="the lease lapsed")
    assert a.leader().holder == "b"  # type: ignore[union-attr]


def test_claim_once_and_only_by_the_holder(stores: Stores) -> None:
    s = stores()
    assert not s.claim("a", "e", 1000)  # no lease
    assert s.acquire(BEAT, "a", 5.0)
    assert s.claim("a", "e", 1000)
    assert not s.claim("a", "e", 1000)  # the same due time
    assert not s.claim("a", "e", 900)  # an earlier one
    assert not s.claim("b", "e", 2000)  # not the holder
    assert s.claim("a", "e", 2000)
    assert s.claim("a", "other", 1000)
    assert s.last_runs() == {"e": 2000, "other": 1000}
    assert [r.key for r in s.runs()] == ["other@1000", "e@2000", "e@1000"]
    assert {r.holder for r in s.runs()} == {"a"}


def test_claim_needs_the_beat_lease_not_any_lease(stores: Stores) -> None:
    s = stores()
    assert s.acquire("election", "a", 5.0)
    assert not s.claim("a", "e", 1000)
    assert not s.advance("a", "e", 1000)


def test_advance_moves_last_without_a_run(stores: Stores) -> None:
    s = stores()
    assert s.acquire(BEAT, "a", 5.0)
    assert s.advance("a", "e", 5000)
    assert not s.advance("a", "e", 5000)
    assert not s.claim("a", "e", 4000)
    assert s.runs() == []
    assert s.last_runs() == {"e": 5000}


def test_concurrent_claims_one_wins(stores: Stores) -> None:
    s = stores()
    assert s.acquire(BEAT, "a", 30.0)
    clients = [stores() for _ in range(4)]
    wins: list[bool] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(clients))

    def claim(store: SharedStore) -> None:
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
    assert s.acquire(BEAT, "h", 5.0) and s.claim("h", "a", 10)
    assert other.remove_entry("a")
    assert not other.remove_entry("a")
    assert s.entries() == {"b": b'{"y": 2}'}
    assert "a" not in s.last_runs()


# -- revoked ids ----------------------------------------------------------------------
def test_revoked_ids_are_seen_by_every_client_when_their_version_moves(
        stores: Stores) -> None:
    writer, reader = stores(), stores()
    version, ids = reader.load_if_changed(object())
    assert ids == {}
    later = time.time() + 3600
    writer.revoke(["r-1", "r-2"], later)
    moved, ids = reader.load_if_changed(version)
    assert moved != version and ids == {"r-1": pytest.approx(later),
                                        "r-2": pytest.approx(later)}
    assert reader.load_if_changed(moved) == (moved, None)  # nothing new: not read
    writer.revoke(["r-1"], later - 60)  # an earlier expiry does not shorten it
    writer.revoke(["r-3"], later + 60)
    again, ids = reader.load_if_changed(moved)
    assert again != moved and ids is not None
    assert ids == reader.revoked()
    assert ids["r-1"] == pytest.approx(later) and set(ids) == {"r-1", "r-2", "r-3"}


def test_expired_revoked_ids_are_not_loaded(stores: Stores) -> None:
    s = stores()
    s.revoke(["gone"], time.time() - 1)
    s.revoke(["kept"], time.time() + 60)
    assert set(s.revoked()) == {"kept"}
