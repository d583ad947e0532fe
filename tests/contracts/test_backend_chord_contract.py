"""The chord half of the result-backend contract (see ``celeriac.backends.base``):
counting a chord's parts, once, under concurrent threads and processes, and the chord
state's expiry. ``test_backend_contract.py`` holds the rest; the two are separate files
so that pytest-xdist's ``--dist loadfile`` runs them side by side.

Each test runs once per backend through the ``backend`` fixture (``conftest.py``).
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from celeriac import states
from celeriac.backends.base import create_backend
from celeriac.settings import Settings
from celeriac.testing import wait_until
from tests.loops import until

from .conftest import BackendFactory

mp = multiprocessing.get_context("fork")


@pytest.fixture
def chords(backend: BackendFactory) -> Iterator[BackendFactory]:
    """``backend``, and the PostgreSQL chord tables dropped after (the shared fixture
    drops only the results table; the chord tables exist only once a chord was counted)."""
    yield backend
    if backend.name == "postgres":
        import psycopg
        from psycopg import sql

        ns = backend.url.rpartition("namespace=")[2]
        with psycopg.connect(backend.url.partition("?")[0], autocommit=True) as conn:
            for table in (f"{ns}_chord_parts", f"{ns}_chords"):  # parts reference chords
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


def test_chord_part_fires_once_when_the_count_reaches_the_size(chords: BackendFactory
                                                               ) -> None:
    b, other = chords(), chords()
    assert b.chord_part("g", "t-1", 3) is False
    assert other.chord_part("g", "t-2", 3) is False  # another instance: the same count
    assert b.chord_part("g", "t-3", 3) is True
    # Later calls: the completing task run again (its first run may have died before it
    # sent the body) is told again; any other task that ran again, or one past the size,
    # is not.
    assert other.chord_part("g", "t-3", 3) is True
    assert other.chord_part("g", "t-1", 3) is False
    assert b.chord_part("g", "t-4", 3) is False


def test_chord_part_counts_a_repeated_task_id_once(chords: BackendFactory) -> None:
    b = chords()
    assert b.chord_part("g", "a", 2) is False
    assert b.chord_part("g", "a", 2) is False, "a repeated part counted twice"
    assert b.chord_part("g", "a", 2) is False
    assert b.chord_part("g", "b", 2) is True
    assert b.chord_part("g", "a", 2) is False
    assert b.chord_part("g", "b", 2) is True  # the completing task, run again


def test_chord_part_of_size_one_and_without_expiry(chords: BackendFactory) -> None:
    b = chords(result_expires=None)
    assert b.chord_part("single", "only", 1) is True
    assert b.chord_part("single", "other", 1) is False
    assert b.chord_part("pair", "x", 2) is False
    assert b.chord_part("pair", "y", 2) is True


def test_store_part_stores_the_result_then_counts_it(chords: BackendFactory) -> None:
    b, other = chords(), chords()
    parts = [b.encode(f"h-{i}", states.SUCCESS, i) for i in range(3)]
    assert b.store_part(parts[0], "g", 3) is False
    assert other.store_part(parts[1], "g", 3) is False
    assert b.store_part(parts[1], "g", 3) is False  # its re-run: counted once
    assert other.store_part(parts[2], "g", 3) is True
    assert other.store_part(parts[2], "g", 3) is True  # the completing task, run again
    # What the completing call reads next: every header result, in order.
    got = other.get_many([f"h-{i}" for i in range(3)])
    assert [got[f"h-{i}"].result for i in range(3)] == [0, 1, 2]
    assert b.wait_for(["h-0", "h-1", "h-2"], 1.0).keys() == {"h-0", "h-1", "h-2"}


def test_chords_are_independent(chords: BackendFactory) -> None:
    b = chords()
    # The same task ids in both: a part is counted per chord.
    assert b.chord_part("g1", "t-1", 2) is False
    assert b.chord_part("g2", "t-1", 3) is False
    assert b.chord_part("g2", "t-2", 3) is False
    assert b.chord_part("g1", "t-2", 2) is True
    assert b.chord_part("g2", "t-2", 3) is False
    assert b.chord_part("g2", "t-3", 3) is True
    assert b.chord_part("g1", "t-3", 2) is False


CHORD_WORKERS = 8
CHORD_ROUNDS = 3


def _count_parts(b: Any, group_id: str, n: int, size: int) -> list[tuple[str, bool]]:
    """Worker ``n``'s calls: its own part, then a duplicate of its neighbour's."""
    return [(tid, b.chord_part(group_id, tid, size))
            for tid in (f"part-{n}", f"part-{(n + 1) % size}")]


def _firers(answers: list[tuple[str, bool]]) -> set[str]:
    """The task ids told to fire: one, however often it was told (a duplicate of the
    completing task is told again)."""
    return {tid for tid, fired in answers if fired}


def test_chord_part_fires_once_under_concurrent_threads(chords: BackendFactory) -> None:
    # The same threads for every round: a PostgreSQL backend keeps a connection per
    # thread until the thread's end is noticed, so new threads per round would pile up.
    instances = [chords() for _ in range(CHORD_WORKERS)]
    barrier = threading.Barrier(CHORD_WORKERS)
    answers: list[list[tuple[str, bool]]] = [[] for _ in range(CHORD_ROUNDS)]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def count(n: int) -> None:
        try:
            for round_ in range(CHORD_ROUNDS):
                barrier.wait(10)  # every round starts together: that is the race
                got = _count_parts(instances[n], f"threads-{round_}", n, CHORD_WORKERS)
                with lock:
                    answers[round_].extend(got)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=count, args=(n,)) for n in range(CHORD_WORKERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    for round_, got in enumerate(answers):
        assert len(got) == 2 * CHORD_WORKERS
        assert len(_firers(got)) == 1, f"round {round_}: fired for {_firers(got)}"
        assert instances[0].chord_part(f"threads-{round_}", "late", CHORD_WORKERS) is False


def _count_rounds_in_child(url: str, n: int, start: Any, out: Any) -> None:
    b = create_backend(url, Settings(result_backend=url))
    try:
        for round_ in range(CHORD_ROUNDS):
            start.wait(10)  # every round starts together: that is the race
            out.put((round_, _count_parts(b, f"processes-{round_}", n, CHORD_WORKERS)))
    finally:
        b.close()


def test_chord_part_fires_once_under_concurrent_processes(chords: BackendFactory) -> None:
    if chords.process_local:
        pytest.skip(f"{chords.name}:// cannot be shared between processes")
    first = chords()
    # The schema (PostgreSQL creates its chord tables on first use) before the race.
    assert first.chord_part("warm-up", "x", 1) is True
    # The same children for every round, as the threads above: a process and its
    # connection cost more than the race itself (a new MySQL connection checks the
    # schema), and a worker's pool children keep theirs too.
    start, out = mp.Barrier(CHORD_WORKERS), mp.Queue()
    children = [mp.Process(target=_count_rounds_in_child, args=(chords.url, n, start, out))
                for n in range(CHORD_WORKERS)]
    for child in children:
        child.start()
    answers: list[list[tuple[str, bool]]] = [[] for _ in range(CHORD_ROUNDS)]
    try:
        for _ in range(CHORD_WORKERS * CHORD_ROUNDS):
            round_, got = out.get(timeout=30)
            answers[round_].extend(got)
    finally:
        for child in children:
            child.join(10)
    assert [c.exitcode for c in children] == [0] * CHORD_WORKERS
    for round_, got in enumerate(answers):
        fired = _firers(got)
        assert len(fired) == 1, f"round {round_}: fired for {fired}"
        assert first.chord_part(f"processes-{round_}", "late", CHORD_WORKERS) is False


@pytest.mark.slow  # waits out a real expiry window
def test_chord_state_expires_with_results(chords: BackendFactory) -> None:
    short = chords(result_expires=2.0)  # a loaded machine keeps a window this long
    assert short.chord_part("lazy", "a", 2) is False
    assert short.chord_part("cleaned", "a", 2) is False
    assert short.chord_part("fired", "x", 1) is True
    # Stored after the chord parts, so it expires no earlier than they do: once it is
    # gone, so are they.
    short.store("sentinel", states.SUCCESS, 1)
    wait_until(lambda: short.get("sentinel") is None, 10.0, message="the result expired")
    assert short.get("sentinel") is None, "the result did not expire"

    # Expired but not cleaned up yet: the count starts over, the flag is gone.
    assert short.chord_part("lazy", "b", 2) is False, "an expired part still counted"
    assert short.chord_part("fired", "x", 1) is True, "an expired fired flag still set"
    # Cleaned up (only results are counted): the same.
    assert short.cleanup() == (0 if short.expires_alone else 1)
    assert short.chord_part("cleaned", "b", 2) is False, "an expired part still counted"
    assert short.chord_part("cleaned", "a", 2) is True
    assert short.chord_part("lazy", "a", 2) is True


def test_cleanup_keeps_unexpired_chords(chords: BackendFactory) -> None:
    b = chords(result_expires=60)
    assert b.chord_part("g", "a", 2) is False
    assert b.chord_part("done", "x", 1) is True
    assert b.cleanup() == 0
    assert b.chord_part("g", "b", 2) is True
    assert b.chord_part("done", "y", 1) is False


def test_chord_part_from_pool_children_is_relayed_to_a_process_local_backend() -> None:
    """memory:// lives in the worker's main process: prefork children count chord parts
    through it (``RelayBackend``), and still exactly one of them is told to fire. Each
    task naps first, so the parent has sent the child its next job before the answer."""
    import asyncio
    import uuid

    import orjson

    from celeriac import Celeriac
    from celeriac.worker.execute import Job, Outcome
    from celeriac.worker.pool.prefork import PreforkPool

    url = f"memory://{uuid.uuid4().hex}"
    app = Celeriac("relay", broker=url, backend=url)

    @app.task(name="chord-part")
    def part(group_id: str, task_id: str, size: int) -> bool:
        time.sleep(0.01)  # sleep-ok: the task's own work
        return app.backend.chord_part(group_id, task_id, size)

    size, calls = 4, [f"p-{n}" for n in (0, 1, 2, 0, 3, 1, 2, 3)]  # each one twice
    done: dict[int, Outcome] = {}

    class Client:
        def __init__(self, pool: PreforkPool) -> None:
            self.pool = pool
            self.waiting = [Job(seq, {"task": "chord-part", "id": f"job-{seq}",
                                      "timelimit": [None, None]},
                                orjson.dumps([["g", tid, size], {}, {}]), "application/json",
                                "celery", 1, "test@host")
                            for seq, tid in enumerate(calls)]

        def dispatch(self) -> None:
            while self.waiting and (self.pool.free_slots() or self.pool.queue_slots()):
                self.pool.submit(self.waiting.pop(0))

        def on_job_done(self, job: Job, outcome: Outcome) -> None:
            done[job.seq] = outcome
            self.dispatch()

        def on_slot(self) -> None:
            self.dispatch()

        def on_job_started(self, job: Job) -> None:
            pass

        def on_job_returned(self, job: Job) -> None:
            self.waiting.insert(0, job)
            self.dispatch()

        def on_job_progress(self, task_id: str, state: str, meta: object) -> None:
            pass

        def on_fatal(self, reason: str) -> None:
            pass

    async def main() -> None:
        pool = PreforkPool(app, 2)
        pool.attach(Client(pool))
        await pool.start()
        try:
            await until(lambda: len(done) >= len(calls), 20, message="every call done")
        finally:
            await pool.stop()

    try:
        asyncio.run(main())
        results = {}
        for seq, outcome in done.items():
            assert outcome.state == states.SUCCESS and outcome.stored is not None, outcome
            app.backend.store_many([outcome.stored])
            meta = app.backend.get(f"job-{seq}")
            assert meta is not None
            results[seq] = meta.result
        told = {calls[seq] for seq, fired in results.items() if fired}
        assert len(told) == 1, results  # one task told to fire (told again if it repeats)
        assert app.backend.chord_part("g", "late", size) is False  # the parent's own count
    finally:
        app.close()
