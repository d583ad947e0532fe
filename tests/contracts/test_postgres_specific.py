"""What the PostgreSQL result backend promises beyond the backend contract.

Every test uses its own namespace (so its own table) and drops the table at teardown.
"""

from __future__ import annotations

import logging
import multiprocessing
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from celeriac import states
from celeriac.backends import postgres
from celeriac.backends.base import ResultBackend, create_backend
from celeriac.errors import BrokerUnavailable, ConfigurationError
from celeriac.settings import Settings
from celeriac.testing import wait_until
from tests.services import require

mp = multiprocessing.get_context("fork")

Factory = Callable[..., ResultBackend]


@pytest.fixture
def server() -> str:
    return require("postgres")


@pytest.fixture
def namespace(server: str) -> Iterator[str]:
    ns = f"tp{uuid.uuid4().hex[:12]}"
    yield ns
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP TABLE IF EXISTS "{ns}_results"')  # its sequence goes with it
        conn.execute(f'DROP SEQUENCE IF EXISTS "{ns}_results_seq"')


@pytest.fixture
def url(server: str, namespace: str) -> str:
    return f"{server}?namespace={namespace}"


@pytest.fixture
def make(url: str) -> Iterator[Factory]:
    made: list[ResultBackend] = []

    def factory(backend_url: str | None = None, **settings: Any) -> ResultBackend:
        u = backend_url or url
        b = create_backend(u, Settings(result_backend=u, **settings))
        made.append(b)
        return b

    yield factory
    for b in made:
        b.close()


def _sessions(server: str, application_name: str) -> int:
    with psycopg.connect(server, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                           (application_name,)).fetchone()
    return int(row[0]) if row else 0


def _race_to_create(url: str, barrier: Any, n: int) -> None:
    b = create_backend(url, Settings(result_backend=url))
    barrier.wait(10)
    b.store(f"racer-{n}", states.SUCCESS, n)  # the first use creates the table
    b.close()


def test_table_is_created_on_first_use_by_racing_processes(server: str, namespace: str,
                                                           make: Factory) -> None:
    url = f"{server}?namespace={namespace}"
    racers = 6
    barrier = mp.Barrier(racers)
    procs = [mp.Process(target=_race_to_create, args=(url, barrier, n)) for n in range(racers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0] * racers
    got = make().get_many([f"racer-{n}" for n in range(racers)])
    assert {m.result for m in got.values()} == set(range(racers))


def test_notify_wakes_a_waiter_at_once(make: Factory) -> None:
    """LISTEN/NOTIFY, not a poll: a missed notification would return at the wait's 5 s
    timeout. Woken, it takes a few milliseconds; the bound leaves a loaded machine's
    scheduling room."""
    waiter, writer = make(), make()
    stored_at: list[float] = []
    woke_at: list[float] = []

    def store_later() -> None:
        for n in range(3):
            time.sleep(0.15)  # sleep-ok: the waiter is asleep by now
            stored_at.append(time.monotonic())
            writer.store(f"t-{n}", states.SUCCESS, n)

    thread = threading.Thread(target=store_later)
    thread.start()
    try:
        for n in range(3):
            got = waiter.wait_for([f"t-{n}"], 5.0)
            woke_at.append(time.monotonic())
            assert got[f"t-{n}"].result == n
    finally:
        thread.join(10)
    latencies = [w - s for w, s in zip(woke_at, stored_at, strict=True)]
    assert max(latencies) < 0.5, latencies


@pytest.mark.parametrize("bad", ["x;drop table y", "1abc", "", "a" * 44, 'a"b', "with-dash",
                                 "sch.tab", "ünï"])
def test_unsafe_namespace_is_rejected(bad: str) -> None:
    url = f"postgresql://postgres:pw@127.0.0.1:1/test?namespace={bad}"
    with pytest.raises(ConfigurationError, match="unsafe namespace") as info:
        create_backend(url, Settings(result_backend=url))  # rejected before connecting
    assert "pw" not in str(info.value)


def test_namespace_defaults_to_celeriac(server: str) -> None:
    b = create_backend(server, Settings(result_backend=server))
    assert isinstance(b, postgres.PostgresBackend) and b.table == "celeriac_results"


def test_connection_failure_names_the_url_with_the_password_masked(make: Factory) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgres://postgres:s3cret@127.0.0.1:{port}/test?namespace=nowhere"
    b = make(url)
    with pytest.raises(BrokerUnavailable) as info:
        b.get("t-1")
    message = str(info.value)
    assert f"postgres://postgres:***@127.0.0.1:{port}/test" in message
    assert "s3cret" not in message
    assert "refused" in message.lower()  # the cause
    assert isinstance(info.value.__cause__, psycopg.OperationalError)


def test_mask_url() -> None:
    assert postgres.mask_url("postgresql://u:p@h:5/d?a=1") == "postgresql://u:***@h:5/d?a=1"
    assert postgres.mask_url("postgresql://u@h/d?password=p&a=1") == (
        "postgresql://u@h/d?password=***&a=1")
    assert postgres.mask_url("postgresql://h/d") == "postgresql://h/d"


def _write_many(url: str, prefix: str, count: int) -> None:
    b = create_backend(url, Settings(result_backend=url))
    for n in range(count):
        b.store(f"{prefix}-{n}", states.SUCCESS, n)
    b.close()


@pytest.mark.slow  # 1,800 commits from six processes: 5-16 s on a loaded machine
def test_concurrent_writers_never_slip_past_the_change_feed(url: str, make: Factory) -> None:
    """Writers committing out of ``seq`` order would hide rows from ``wait_for``'s
    cursor: it would then wait out its timeout for results that are stored."""
    waiter = make()
    waiter.store("warm", states.SUCCESS, 0)  # creates the table
    ids = [f"w{k}-{n}" for k in range(6) for n in range(300)]
    procs = [mp.Process(target=_write_many, args=(url, f"w{k}", 300)) for k in range(6)]
    for p in procs:
        p.start()
    t0 = time.monotonic()
    try:
        got = waiter.wait_for(ids, 30.0)
    finally:
        for p in procs:
            p.join(30)
    assert len(got) == len(ids)
    assert time.monotonic() - t0 < 15


def _use_in_child(backend: ResultBackend, out: Any) -> None:
    backend.store("from-child", states.SUCCESS, "child")
    meta = backend.get("from-parent")
    out.put(meta.result if meta else None)
    backend.close()  # must leave the parent's connections alone


def test_a_forked_child_opens_its_own_connections(make: Factory,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    b = make()
    b.store("from-parent", states.SUCCESS, "parent")
    assert b.wait_for(["from-parent"], 1.0)  # the parent holds a connection and a listener
    out = mp.Queue()
    child = mp.Process(target=_use_in_child, args=(b, out))
    child.start()
    assert out.get(timeout=10) == "parent"
    child.join(10)
    assert child.exitcode == 0
    with caplog.at_level(logging.WARNING, logger="celeriac.backends.postgres"):
        meta = b.get("from-child")
        assert b.wait_for(["from-child"], 1.0)
    assert meta is not None and meta.result == "child"
    assert not caplog.records, "the child disturbed the parent's connection"


def test_reconnects_after_the_server_ends_the_session(server: str, url: str, make: Factory,
                                                      caplog: pytest.LogCaptureFixture
                                                      ) -> None:
    app_name = f"celeriac-test-{uuid.uuid4().hex[:8]}"  # other URL parameters reach libpq
    b = make(f"{url}&application_name={app_name}")
    b.store("t-1", states.SUCCESS, 1)
    assert _sessions(server, app_name) == 1
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                      " WHERE application_name = %s", (app_name,))
    wait_until(lambda: _sessions(server, app_name) == 0, 5, message="session terminated")
    with caplog.at_level(logging.WARNING, logger="celeriac.backends.postgres"):
        b.store("t-2", states.SUCCESS, 2)
    assert any("reconnecting" in r.getMessage() for r in caplog.records)
    got = b.get_many(["t-1", "t-2"])
    assert {k: m.result for k, m in got.items()} == {"t-1": 1, "t-2": 2}


def test_connections_of_ended_threads_are_closed(server: str, url: str, make: Factory,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postgres, "REAP_EVERY", 0.0)
    app_name = f"celeriac-test-{uuid.uuid4().hex[:8]}"
    b = make(f"{url}&application_name={app_name}")
    b.store("t-1", states.SUCCESS, 1)
    all_waited = threading.Barrier(3)

    def wait_then_end() -> None:
        b.wait_for(["t-1"], 1.0)
        all_waited.wait(10)  # alive until every thread has its connections

    threads = [threading.Thread(target=wait_then_end) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert _sessions(server, app_name) == 7  # ours, and a connection + a listener per thread
    b.get("t-1")  # any use reaps
    assert _sessions(server, app_name) == 1


def test_wait_for_survives_its_listener_being_closed_as_idle(make: Factory,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    monkeypatch.setattr(postgres, "REAP_EVERY", 0.0)
    monkeypatch.setattr(postgres, "LISTENER_IDLE", 0.0)  # every use closes idle listeners
    waiter, writer = make(), make()

    def store_later() -> None:
        for n in range(5):
            time.sleep(0.05)  # sleep-ok: store after the waiter is asleep
            writer.store(f"t-{n}", states.STARTED, None)
            waiter.get("unrelated")  # reaps the waiter's listener between its waits
        writer.store("t-4", states.SUCCESS, "done")

    thread = threading.Thread(target=store_later)
    thread.start()
    t0 = time.monotonic()
    try:
        got = waiter.wait_for(["t-4"], 5.0)
    finally:
        thread.join(10)
    assert got["t-4"].result == "done"
    assert time.monotonic() - t0 < 2.0


def test_a_dropped_table_is_created_again(server: str, namespace: str, make: Factory) -> None:
    b = make()
    b.store("t-1", states.SUCCESS, 1)
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'DROP TABLE "{namespace}_results"')
    b.store("t-2", states.SUCCESS, 2)
    assert b.get("t-1") is None
    meta = b.get("t-2")
    assert meta is not None and meta.result == 2
