"""The interface every system under test implements (``System``), and the wait for the
I/O tasks' counter that the I/O systems share. The systems: ``celeriac_systems.py``,
``peer_systems.py``; the ``--systems`` names: ``SYSTEMS`` in ``run.py``."""

from __future__ import annotations

import abc
import time
from pathlib import Path

import tasks as bench_tasks
from harness import BenchError, WorkerProcess, io_counter, log_tail


class System(abc.ABC):
    """One broker + result store + worker, driven from this process.

    The harness calls, per run: ``setup`` (fresh, empty broker), for each of
    ``bulk_methods`` ``enqueue_bulk`` then ``purge``, ``enqueue``, ``start_worker``,
    ``wait_results``, ``latency``, and always ``stop_worker`` and ``teardown``; and
    ``close`` once after the last run. The harness reads the clocks, except
    ``start_worker`` (the worker reports when it began consuming) and ``latency`` (each
    sample is timed where the call is made).
    """

    key: str
    """The ``--systems`` name."""
    name: str
    """Row label."""
    detail: str
    """One line on how it runs (worker, pool), shown under the table."""
    bulk_methods: dict[str, str] = {}
    """Bulk enqueue methods: short label -> what exactly is called."""
    io: bool = False
    """The task does one Redis round trip (INCR on a connection of its own) and stores no
    result; the drain is timed until the counter reaches N. Such systems measure
    ``delay()`` and the drain only."""

    canvas = False
    """It measures the canvas rows (``canvas_group``, ``canvas_chord``)."""

    sent = 0
    """Tasks sent by the last ``enqueue``."""
    scale = 1
    """Workers it runs (each of 2 processes); each run sends N x this many tasks."""

    @property
    def io_key(self) -> str:
        return f"bench:io:{self.key}"

    @abc.abstractmethod
    def setup(self, workdir: Path) -> None:
        """A fresh, empty broker and result store for one run; ``workdir`` is empty."""

    @abc.abstractmethod
    def enqueue(self, n: int) -> None:
        """Publish ``n`` no-op tasks one ``delay()`` each, as a user would; keep the ids."""

    def enqueue_bulk(self, n: int, batch: int, method: str) -> None:
        """Publish ``n`` no-op tasks with bulk ``method`` (``batch`` per round trip)."""
        raise NotImplementedError

    def purge(self) -> None:
        """Delete every waiting message (after ``enqueue_bulk``)."""

    @abc.abstractmethod
    def start_worker(self, deadline: float) -> float:
        """Start one worker on the full queue; return the unix time it began consuming.

        Raise ``BenchError`` if it is not consuming by ``deadline`` (``time.monotonic``).
        """

    @abc.abstractmethod
    def wait_results(self, timeout: float) -> int:
        """Block until every task of ``enqueue`` has its result stored or ``timeout``
        passes; return how many succeeded."""

    @abc.abstractmethod
    def latency(self, count: int, warmup: int, timeout: float) -> list[float]:
        """Seconds per call of ``count`` sequential ``delay()`` + wait for the result,
        after ``warmup`` untimed ones."""

    def canvas_group(self, n: int, timeout: float) -> float:
        """Seconds to send a group of ``n`` no-ops (results stored) and have every result
        back, with the worker idle; raise if not all are back within ``timeout``."""
        raise NotImplementedError

    def canvas_chord(self, m: int, timeout: float) -> float:
        """Seconds from sending a chord of ``m`` no-ops (its body given their results'
        list, returning its length) to the body's result; raise if not back by
        ``timeout`` or if the body did not get ``m`` results."""
        raise NotImplementedError

    @abc.abstractmethod
    def stop_worker(self) -> None:
        """Stop the worker if it runs (bounded; idempotent; also after a failure)."""

    def teardown(self) -> None:
        """Release what ``setup`` made (bounded; idempotent)."""

    def close(self) -> None:
        """Release what outlives one run (a peer's driver); bounded, idempotent."""

    def diagnostics(self) -> str:
        """The end of the worker's (and driver's) log, for a failed run's report."""
        worker = getattr(self, "worker", None)
        if isinstance(worker, WorkerProcess):
            return f"worker log:\n{log_tail(worker.log_path)}"
        return ""


def wait_io(system: System, timeout: float) -> int:
    """Block until the I/O tasks' counter reaches N or ``timeout`` passes; returns it.
    Polled every 2 ms (one GET), checking on the worker once a second."""
    client, key, n = io_counter(), system.io_key, system.sent
    deadline = time.monotonic() + timeout
    next_check = time.monotonic() + 1.0
    seen = 0
    try:
        while True:
            done = int(client.get(key) or 0)
            if done < seen:
                # Only INCRs touch it: something else emptied the database mid-run.
                raise BenchError(f"the I/O counter went down from {seen} to {done}: "
                                 f"another program emptied {bench_tasks.IO_URL}")
            seen = done
            if done >= n or time.monotonic() >= deadline:
                return done
            if time.monotonic() >= next_check:
                next_check += 1.0
                worker = getattr(system, "worker", None)
                if worker is not None:
                    worker.check_alive("mid-drain")
            time.sleep(0.002)
    finally:
        client.close()
