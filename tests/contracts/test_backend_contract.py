"""The contract every result backend keeps (see ``celeriac.backends.base``).

Each test runs once per backend through the ``backend`` fixture (``conftest.py``).
The chord tests are in ``test_backend_chord_contract.py``.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
import traceback
from typing import Any

import pytest

from celeriac import states
from celeriac.backends.base import ResultMeta, create_backend
from celeriac.settings import Settings
from celeriac.testing import wait_until

from .conftest import BackendFactory

IDLE = 0.15
"""How long a waiter is left asleep before the store that must wake it."""
WAKE_LATENCY = 0.5
"""``wait_for`` returns within this long after the result is stored. The mechanism is
what is checked: a waiter that is not woken returns at its 3-5 s timeout, a woken one
within milliseconds; the bound leaves room for a loaded machine's scheduling. (Celery's
database layout also polls every 0.1 s, for Celery's writes, which do not notify: inside
the bound; ``test_postgres_specific.py`` checks that our writes wake at once.)"""
SLACK = 0.5
"""How much later than asked a timed wait may return (a loaded machine's scheduling)."""
EXPIRY_SLACK = 1.5
"""How much later than its ``result_expires`` a result may still be read: a store and a
read each take a round trip, which on a loaded machine's PostgreSQL or MySQL can take a
few hundred milliseconds (a result that never expires fails the wait, not this bound)."""
EARLY = 0.01
"""Clock granularity allowed when checking that a wait did not end too early."""
MAX_CPU_SHARE = 0.25
"""A sleeping waiter uses at most this share of one CPU (it must not busy-poll)..."""
READS_CPU = 0.02
"""...plus this many seconds: the reads of a backend that polls (MySQL, every 0.1 s),
whose CPU a loaded machine inflates. A busy-poller spends far more in a 0.15 s wait."""

mp = multiprocessing.get_context("fork")


class ContractError(Exception):
    """An exception type defined outside the standard library."""


# -- store and read ---------------------------------------------------------------------

def test_success_round_trip(backend: BackendFactory) -> None:
    value = {"list": [1, 2.5, "drei", None, True], "nested": {"ü": "\U0001f955"}, "n": 2**40}
    writer, reader = backend(), backend()
    writer.store("t-1", states.SUCCESS, value, retries=2)
    writer.store("t-2", states.SUCCESS, None)
    for b in (writer, reader):  # another instance on the same store sees it too
        meta = b.get("t-1")
        assert meta is not None
        assert (meta.task_id, meta.state, meta.result, meta.traceback, meta.retries) == (
            "t-1", states.SUCCESS, value, None, 0 if b.retries_with_request else 2)
        assert meta.ready and meta.date_done is not None
        none = b.get("t-2")
        assert none is not None and none.state == states.SUCCESS and none.result is None


def test_compressed_results_read_back_and_readers_decompress_without_the_setting(
        backend: BackendFactory) -> None:
    value = {"text": "celeriac " * 2000, "n": [1, 2, 3]}
    writer, plain = backend(result_compression="gzip"), backend()
    writer.store("t-z", states.SUCCESS, value)
    plain.store("t-p", states.SUCCESS, value)  # stored before the setting: still read
    for b in (writer, plain):
        for task_id in ("t-z", "t-p"):
            meta = b.get(task_id)
            assert meta is not None and meta.result == value, (b, task_id)
    stored = writer.encode("t-z", states.SUCCESS, value)
    if writer.compresses:
        assert stored.data.startswith(b"\x00celery-compressed\x00application/x-gzip\x00")
        assert len(stored.data) < 1000  # 18 KB of text, compressed
    else:  # Celery's database layout: its readers do not decompress (nor does Celery)
        assert b"celeriac celeriac" in stored.data


def test_get_unknown_id_returns_none(backend: BackendFactory) -> None:
    b = backend()
    assert b.get("never-stored") is None
    b.store("other", states.SUCCESS, 1)
    assert b.get("never-stored") is None


def test_a_later_store_replaces_the_state(backend: BackendFactory) -> None:
    b = backend()
    b.store("t-1", states.STARTED, {"pid": 1})
    started = b.get("t-1")
    assert started is not None and started.state == states.STARTED and not started.ready
    assert started.date_done is None
    b.store("t-1", states.SUCCESS, 42)
    done = b.get("t-1")
    assert done is not None and (done.state, done.result, done.ready) == (
        states.SUCCESS, 42, True)


def test_failure_stores_the_exception_and_traceback(backend: BackendFactory) -> None:
    b = backend()
    stored: dict[str, tuple[BaseException, str]] = {}
    for tid, exc in [("builtin", ValueError("bad value", 3)),
                     ("custom", ContractError("kaputt"))]:
        try:
            raise exc
        except Exception as caught:
            tb = traceback.format_exc()
            b.store(tid, states.FAILURE, caught, traceback=tb)
            stored[tid] = (caught, tb)

    builtin = b.get("builtin")
    assert builtin is not None and builtin.state == states.FAILURE and builtin.ready
    assert builtin.result == {"exc_type": "ValueError", "exc_module": "builtins",
                              "exc_message": ["bad value", 3]}
    assert builtin.traceback == stored["builtin"][1]
    assert "ValueError: ('bad value', 3)" in (builtin.traceback or "")

    custom = b.get("custom")
    assert custom is not None and custom.state == states.FAILURE
    assert custom.result == {"exc_type": "ContractError", "exc_module": __name__,
                             "exc_message": ["kaputt"]}
    assert custom.traceback == stored["custom"][1]


def test_unencodable_result_is_stored_as_an_encode_error_failure(backend: BackendFactory
                                                                 ) -> None:
    b = backend()
    b.store("t-set", states.SUCCESS, {1, 2, 3})  # must not raise
    b.store("t-obj", states.SUCCESS, {"x": object()})
    for tid in ("t-set", "t-obj"):
        meta = b.get(tid)
        assert meta is not None
        assert meta.state == states.FAILURE and meta.ready
        assert meta.result["exc_type"] == "EncodeError"
        assert meta.result["exc_module"] == "celeriac.errors"
        assert isinstance(meta.result["exc_message"], list) and meta.result["exc_message"]


def test_results_expire_and_cleanup_deletes_them(backend: BackendFactory) -> None:
    short, forever = backend(result_expires=0.2), backend(result_expires=None)
    # "forever" first: where the cleaner's setting decides by age for every row, it is
    # then as old as the others when they are found expired, however slow the stores.
    forever.store("forever", states.SUCCESS, 3)
    t0 = time.monotonic()
    short.store("short-1", states.SUCCESS, 1)
    short.store("short-2", states.FAILURE, ValueError("x"))
    stored = short.get_many(["short-1", "short-2"])
    if time.monotonic() - t0 < 0.2 - EARLY:
        # Read back within the window (a loaded machine may not get there in time: the
        # expiry below is then all that can be checked).
        assert set(stored) == {"short-1", "short-2"}

    wait_until(lambda: not short.get_many(["short-1", "short-2"]), 10.0,
               message="the results expired")
    gone_after = time.monotonic() - t0
    assert short.get("short-1") is None, "the result did not expire"
    assert short.get("short-2") is None, "the result did not expire"
    assert gone_after >= 0.2 - EARLY
    assert gone_after < 0.2 + EXPIRY_SLACK

    # Where keys expire by themselves and nothing lists them, there is nothing to clean.
    # Where a result has no expiry of its own, the cleaner's setting decides for all.
    assert short.cleanup() == (0 if short.expires_alone else 3 if short.expiry_by_age
                               else 2)
    assert short.cleanup() == 0
    if not short.expiry_by_age:
        still = forever.get("forever")
        assert still is not None and still.result == 3
    assert forever.cleanup() == 0


def test_cleanup_keeps_unexpired_results(backend: BackendFactory) -> None:
    b = backend(result_expires=60)
    b.store("t-1", states.SUCCESS, 1)
    assert b.cleanup() == 0
    assert b.get("t-1") is not None


def test_forget(backend: BackendFactory) -> None:
    b = backend()
    b.store("t-1", states.SUCCESS, 1)
    b.store("t-2", states.SUCCESS, 2)
    b.forget("t-1")
    b.forget("never-stored")  # no error
    assert b.get("t-1") is None
    assert backend().get("t-1") is None
    kept = b.get("t-2")
    assert kept is not None and kept.result == 2


def test_get_many(backend: BackendFactory) -> None:
    b = backend()
    b.store("a", states.SUCCESS, "A")
    b.store("b", states.STARTED, None)
    b.store("c", states.FAILURE, KeyError("k"))
    got = b.get_many(["a", "b", "c", "unknown"])
    assert set(got) == {"a", "b", "c"}
    assert {k: (m.task_id, m.state) for k, m in got.items()} == {
        "a": ("a", states.SUCCESS), "b": ("b", states.STARTED), "c": ("c", states.FAILURE)}
    assert got["a"].result == "A"
    assert b.get_many([]) == {}
    many = [f"m-{n}" for n in range(1200)]
    for tid in many[::100]:
        b.store(tid, states.SUCCESS, tid)
    assert set(b.get_many(many)) == set(many[::100])


def test_store_many_stores_every_result_of_a_batch(backend: BackendFactory) -> None:
    writer, reader = backend(), backend()
    writer.store("replaced", states.STARTED, None)
    items = [writer.encode(f"b-{n}", states.SUCCESS, {"n": n}, retries=n % 3)
             for n in range(300)]
    items.append(writer.encode("replaced", states.SUCCESS, "now"))
    items.append(writer.encode("failed", states.FAILURE, ValueError("v"), traceback="tb"))
    writer.store_many(items)
    writer.store_many([])  # nothing to do, no error
    got = reader.get_many([f"b-{n}" for n in range(300)] + ["replaced", "failed"])
    assert len(got) == 302
    kept = not reader.retries_with_request  # no request was given (Celery's layouts)
    assert all((got[f"b-{n}"].state, got[f"b-{n}"].result, got[f"b-{n}"].retries) ==
               (states.SUCCESS, {"n": n}, n % 3 if kept else 0) for n in range(300))
    assert (got["replaced"].state, got["replaced"].result) == (states.SUCCESS, "now")
    failed = got["failed"]
    assert failed.state == states.FAILURE and failed.traceback == "tb"
    assert failed.result == {"exc_type": "ValueError", "exc_module": "builtins",
                             "exc_message": ["v"]}


def test_store_many_wakes_a_waiter_once_for_the_batch(backend: BackendFactory) -> None:
    waiter, writer = backend(), backend()
    ids = [f"w-{n}" for n in range(50)]
    stored_at: list[float] = []
    started = threading.Event()

    def store_later() -> None:
        assert started.wait(5)
        time.sleep(IDLE)  # sleep-ok: let the waiter fall asleep: that is the point
        writer.store_many([writer.encode(t, states.SUCCESS, t) for t in ids])
        stored_at.append(time.monotonic())

    thread = threading.Thread(target=store_later)
    thread.start()
    started.set()
    try:
        got, returned_at, _ = _timed_wait_for(waiter, ids, 5.0)
    finally:
        thread.join(10)
    assert {k: m.result for k, m in got.items()} == {t: t for t in ids}
    assert returned_at - stored_at[0] < WAKE_LATENCY


@pytest.mark.slow  # waits out a real expiry window
def test_store_many_results_expire(backend: BackendFactory) -> None:
    short = backend(result_expires=2.0)  # a loaded machine reads them back within it
    short.store_many([short.encode(f"e-{n}", states.SUCCESS, n) for n in range(3)])
    assert len(short.get_many([f"e-{n}" for n in range(3)])) == 3
    wait_until(lambda: not short.get_many([f"e-{n}" for n in range(3)]), 15.0,
               message="the results expired")
    assert short.get_many([f"e-{n}" for n in range(3)]) == {}
    assert short.cleanup() == (0 if short.expires_alone else 3)


# -- waiting ----------------------------------------------------------------------------

def _timed_wait_for(b: Any, task_ids: list[str], timeout: float, **kw: Any
                    ) -> tuple[dict[str, ResultMeta], float, float]:
    """``wait_for`` and when it returned (monotonic) and the CPU its thread used."""
    cpu0 = time.thread_time()
    got = b.wait_for(task_ids, timeout, **kw)
    return got, time.monotonic(), time.thread_time() - cpu0


def test_wait_for_wakes_when_another_thread_stores(backend: BackendFactory) -> None:
    waiter, writer = backend(), backend()
    waiter.store("already", states.SUCCESS, 0)
    stored_at: list[float] = []
    started = threading.Event()

    def store_later() -> None:
        assert started.wait(5)
        time.sleep(IDLE)  # sleep-ok: let the waiter fall asleep: that is the point
        writer.store("t-1", states.STARTED, None)  # not ready: keeps waiting
        time.sleep(IDLE / 2)  # sleep-ok: a store while it sleeps
        writer.store("t-1", states.SUCCESS, "done")
        stored_at.append(time.monotonic())

    thread = threading.Thread(target=store_later)
    thread.start()
    t0 = time.monotonic()
    started.set()
    try:
        got, returned_at, cpu = _timed_wait_for(waiter, ["already", "t-1"], 5.0)
    finally:
        thread.join(10)
    assert set(got) == {"already", "t-1"}
    assert got["t-1"].state == states.SUCCESS and got["t-1"].result == "done"
    assert returned_at - stored_at[0] < WAKE_LATENCY
    assert cpu < MAX_CPU_SHARE * (returned_at - t0) + READS_CPU, \
        f"wait_for busy-polls: {cpu:.3f}s of CPU in {returned_at - t0:.3f}s"


def _store_later_in_child(url: str, started: Any, out: Any) -> None:
    writer = create_backend(url, Settings(result_backend=url))
    assert started.wait(5)
    time.sleep(IDLE)  # sleep-ok: let the waiter fall asleep: that is the point
    writer.store("t-1", states.SUCCESS, {"from": "child"})
    out.put(time.monotonic())  # CLOCK_MONOTONIC is system-wide: comparable across processes
    writer.close()


def test_wait_for_wakes_when_another_process_stores(backend: BackendFactory) -> None:
    if backend.process_local:
        pytest.skip(f"{backend.name}:// cannot be shared between processes")
    waiter = backend()
    # Connected (and the schema checked) before the timed wait, as in the thread test
    # above: the CPU checked is the waiting's, not a first connection's.
    assert waiter.get("t-1") is None
    started, out = mp.Event(), mp.Queue()
    child = mp.Process(target=_store_later_in_child, args=(backend.url, started, out))
    child.start()
    try:
        t0 = time.monotonic()
        started.set()
        got, returned_at, cpu = _timed_wait_for(waiter, ["t-1"], 5.0)
        stored_at = out.get(timeout=5)
    finally:
        child.join(10)
    assert child.exitcode == 0
    assert got["t-1"].result == {"from": "child"}
    assert returned_at - stored_at < WAKE_LATENCY
    assert cpu < MAX_CPU_SHARE * (returned_at - t0) + READS_CPU, \
        f"wait_for busy-polls: {cpu:.3f}s of CPU in {returned_at - t0:.3f}s"


def test_wait_for_does_not_miss_a_store_just_before_it_sleeps(backend: BackendFactory
                                                              ) -> None:
    """A result stored between the waiter's check and its sleep must still wake it.

    ``on_ready`` runs in the waiter between its read and its sleep; it has another thread
    store the second result right then (and waits until that store is done).
    """
    waiter, writer = backend(), backend()
    waiter.store("first", states.SUCCESS, 1)
    stored_at: list[float] = []

    def store_second() -> None:
        writer.store("second", states.SUCCESS, 2)
        stored_at.append(time.monotonic())

    def on_ready(meta: ResultMeta) -> None:
        if meta.task_id == "first":
            thread = threading.Thread(target=store_second)
            thread.start()
            thread.join(5)

    got, returned_at, _ = _timed_wait_for(waiter, ["first", "second"], 3.0, on_ready=on_ready)
    assert set(got) == {"first", "second"}
    assert returned_at - stored_at[0] < WAKE_LATENCY


def test_wait_for_is_not_disturbed_by_another_thread_reading(backend: BackendFactory
                                                             ) -> None:
    """One backend instance serves many threads (an app's ``AsyncResult.get()`` in one
    request thread, ``AsyncResult.state`` in another): another thread's read must not
    swallow the wake-up of a thread in ``wait_for``.

    Between the waiter's read and its sleep (in ``on_ready``), one thread stores the
    second result and then another thread reads through the waiter's own instance.
    """
    waiter, writer = backend(), backend()
    waiter.store("first", states.SUCCESS, 1)
    stored_at: list[float] = []

    def store_second() -> None:
        writer.store("second", states.SUCCESS, 2)
        stored_at.append(time.monotonic())

    def read_something() -> None:
        waiter.get("unrelated")

    def on_ready(meta: ResultMeta) -> None:
        if meta.task_id == "first":
            for target in (store_second, read_something):
                thread = threading.Thread(target=target)
                thread.start()
                thread.join(5)
            # Timed from here: the reader's first connection (a new thread's) may take a
            # while on a loaded machine, and the waiter cannot sleep before on_ready ends.
            stored_at.append(time.monotonic())

    got, returned_at, _ = _timed_wait_for(waiter, ["first", "second"], 3.0, on_ready=on_ready)
    assert set(got) == {"first", "second"}
    assert returned_at - stored_at[-1] < WAKE_LATENCY


def test_wait_for_calls_on_ready_once_per_result(backend: BackendFactory) -> None:
    b = backend()
    for n in range(3):
        b.store(f"t-{n}", states.SUCCESS, n)
    seen: list[str] = []
    got = b.wait_for(["t-0", "t-1", "t-2", "t-1"], 1.0, on_ready=lambda m: seen.append(m.task_id))
    assert sorted(seen) == ["t-0", "t-1", "t-2"]
    assert {k: m.result for k, m in got.items()} == {"t-0": 0, "t-1": 1, "t-2": 2}


def test_wait_for_times_out_with_what_is_ready(backend: BackendFactory) -> None:
    b = backend()
    b.store("started", states.STARTED, None)  # known but not ready
    b.store("done", states.SUCCESS, 1)

    t0 = time.monotonic()
    got, returned_at, cpu = _timed_wait_for(b, ["never", "started"], 0.3)
    waited = returned_at - t0
    assert got == {}
    assert 0.3 - EARLY <= waited < 0.3 + SLACK
    assert cpu < MAX_CPU_SHARE * waited + READS_CPU, \
        f"wait_for busy-polls: {cpu:.3f}s of CPU in {waited:.3f}s"

    t0 = time.monotonic()
    got, returned_at, _ = _timed_wait_for(b, ["done", "never"], 0.2)
    assert set(got) == {"done"}
    assert 0.2 - EARLY <= returned_at - t0 < 0.2 + SLACK

    t0 = time.monotonic()
    assert b.wait_for(["never"], 0) == {}
    assert time.monotonic() - t0 < SLACK
