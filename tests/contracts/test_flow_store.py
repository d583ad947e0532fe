"""The shared store's flow-control contract (``celeriac.stores.flow``): unique jobs'
locks (``hold``, ``swap``, released by the lease's ``release``) and concurrency slots,
the same assertions on every store (memory, SQLite, Redis, PostgreSQL), each test on a
store of its own (the fixture of ``test_store_contract.py``)."""

from __future__ import annotations

import threading
import time

import pytest

from tests.contracts import test_store_contract
from tests.contracts.test_store_contract import Stores

stores = test_store_contract.stores  # the fixture: one store of each kind per test


def test_hold_takes_a_free_lock_and_names_its_holder_to_others(stores: Stores) -> None:
    a, b = stores(), stores()
    assert a.hold("unique:k", "t1", 30) is None
    assert b.hold("unique:k", "t2", 30) == "t1"
    assert a.hold("unique:k", "t1", 30) is None  # its holder renews it
    assert b.holder("unique:k") == "t1"
    b.release("unique:k", "t2")  # not t2's to drop
    assert a.holder("unique:k") == "t1"
    a.release("unique:k", "t1")
    assert b.hold("unique:k", "t2", 30) is None


def test_a_lock_lapses_after_its_ttl(stores: Stores) -> None:
    a = stores()
    assert a.hold("unique:short", "t1", 0.2) is None
    deadline = time.monotonic() + 10
    while a.hold("unique:short", "t2", 30) is not None:
        assert time.monotonic() < deadline, "the lock never lapsed"
        time.sleep(0.05)  # sleep-ok: polls the store's clock
    assert a.holder("unique:short") == "t2"


def test_swap_takes_the_lock_from_anyone_and_says_from_whom(stores: Stores) -> None:
    a, b = stores(), stores()
    assert a.swap("unique:d", "t1", 30) is None
    assert b.swap("unique:d", "t2", 30) == "t1"
    assert a.swap("unique:d", "t2", 30) is None  # itself: nobody else
    assert a.hold("unique:d", "t3", 30) == "t2"


def test_concurrent_holds_let_exactly_one_through(stores: Stores) -> None:
    made = [stores() for _ in range(4)]
    won: list[str] = []
    barrier = threading.Barrier(len(made))

    def go(i: int) -> None:
        barrier.wait(10)
        if made[i].hold("unique:race", f"t{i}", 30) is None:
            won.append(f"t{i}")

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(made))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert len(won) == 1 and made[0].holder("unique:race") == won[0]


def test_slots_count_up_to_the_limit_and_come_back(stores: Stores) -> None:
    a, b = stores(), stores()
    assert a.slot_take("conc:t", "w1:1", 2, 30)
    assert b.slot_take("conc:t", "w2:1", 2, 30)
    assert not a.slot_take("conc:t", "w1:2", 2, 30)
    assert a.slot_take("conc:t", "w1:1", 2, 30)  # its own: renewed, still two
    assert b.slot_take("conc:other", "w2:2", 1, 30)  # another name counts apart
    assert a.slot_holders("conc:t") == ["w1:1", "w2:1"]
    b.slot_release("conc:t", "w2:1")
    assert a.slot_take("conc:t", "w1:2", 2, 30)
    assert b.slot_holders("conc:t") == ["w1:1", "w1:2"]


def test_a_slot_not_renewed_lapses_and_renewal_keeps_it(stores: Stores) -> None:
    a = stores()
    assert a.slot_take("conc:lease", "dead:1", 2, 0.3)
    assert a.slot_take("conc:lease", "live:1", 2, 0.3)
    deadline = time.monotonic() + 10
    while "dead:1" in a.slot_holders("conc:lease"):
        assert a.slot_renew("conc:lease", ["live:1", "never:1"], 0.3) == 1
        assert time.monotonic() < deadline, "the slot never lapsed"
        time.sleep(0.05)  # sleep-ok: polls the store's clock
    assert a.slot_holders("conc:lease") == ["live:1"]
    assert a.slot_renew("conc:lease", ["dead:1"], 30) == 0  # lapsed: not taken again
    assert a.slot_take("conc:lease", "new:1", 2, 30)


def test_concurrent_slot_takes_never_pass_the_limit(stores: Stores) -> None:
    made = [stores() for _ in range(4)]
    got: list[str] = []
    barrier = threading.Barrier(len(made))

    def go(i: int) -> None:
        barrier.wait(10)
        for j in range(3):
            if made[i].slot_take("conc:race", f"w{i}:{j}", 3, 30):
                got.append(f"w{i}:{j}")

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(made))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert len(got) == 3 and sorted(got) == made[0].slot_holders("conc:race")


@pytest.mark.parametrize("limit", [0, -1, 1.5, True])
def test_bad_slot_limits_are_refused_naming_the_parameter(stores: Stores,
                                                          limit: object) -> None:
    with pytest.raises(ValueError, match="limit must be an int >= 1"):
        stores().slot_take("conc:bad", "h", limit, 30)  # type: ignore[arg-type]
