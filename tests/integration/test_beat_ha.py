"""Beat, highly available: real ``celeriac beat`` processes on Redis, PostgreSQL and
SQLite stores. Three beats start at once; the leader is killed with SIGKILL twice; all
beats stop for 5 s and three start again. Over the run every due time was claimed once
and sent once: the ledger of run keys and the messages in the queue agree, with no
double and no miss beyond the ``once`` policy (one run per outage for its windows)."""

from __future__ import annotations

import asyncio
import collections
import itertools
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from celeriac import Settings
from celeriac.beat.service import task_id_for
from celeriac.stores import Run, SharedStore, open_store
from celeriac.testing import wait_until
from celeriac.transports.base import create_transport
from tests.contracts.conftest import _drop_redis_namespace
from tests.services import require

ROOT = Path(__file__).parent.parent.parent
LEASE = 2.0
pytestmark = pytest.mark.slow


def wait_for(what: str, check: Callable[[], Any], timeout: float = 40.0) -> Any:
    """Poll ``check`` until it returns something true; fail after ``timeout`` (generous:
    three beat processes starting at once on a loaded 2-CPU machine printed nothing for
    15 s)."""
    return wait_until(check, timeout, 0.05, message=what)


class Beats:
    """The test's beat processes (``celeriac -A tests.integration.beat_app beat``)."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.env = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
        self.cwd = cwd
        self.procs: list[subprocess.Popen[bytes]] = []
        self.n = 0

    def start(self, *extra: str) -> subprocess.Popen[bytes]:
        self.n += 1
        log = open(self.cwd / f"beat{self.n}.log", "wb")  # noqa: SIM115 (the process's)
        proc = subprocess.Popen(
            [sys.executable, "-m", "celeriac", "-A", "tests.integration.beat_app", "beat",
             "-l", "info", *extra], env=self.env, cwd=self.cwd, stdout=log, stderr=log)
        log.close()
        self.procs.append(proc)
        return proc

    def by_pid(self, pid: int) -> subprocess.Popen[bytes]:
        return next(p for p in self.procs if p.pid == pid)

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def logs(self) -> str:
        return "\n".join(f"--- beat{i}\n" + (self.cwd / f"beat{i}.log").read_text()[-3000:]
                         for i in range(1, self.n + 1))


def _redis_url() -> str:
    return f"{require('redis')}?namespace=b{uuid.uuid4().hex[:10]}"


def _postgres_url() -> str:
    return f"{require('postgres')}?namespace=b{uuid.uuid4().hex[:10]}"


STORES: dict[str, Callable[[Path], str]] = {
    "redis": lambda tmp: _redis_url(),
    "postgres": lambda tmp: _postgres_url(),
    "sqlite": lambda tmp: f"sqlite:///{tmp / 'store.db'}",
}


@pytest.fixture
def store_urls(tmp_path: Path) -> Iterator[dict[str, str]]:
    urls = {name: make(tmp_path) for name, make in STORES.items()}
    yield urls
    _drop_redis_namespace(urls["redis"])
    store = open_store(Settings(result_backend=urls["postgres"]), urls["postgres"])
    store.drop()  # type: ignore[attr-defined]
    store.close()


def drain(broker: str, queue: str = "celery") -> list[str]:
    """Every task id waiting in ``queue`` (consumed and acked)."""
    async def run() -> list[str]:
        transport = create_transport(broker, Settings(broker_url=broker))
        await transport.connect(f"drain-{uuid.uuid4().hex[:6]}")
        ids: list[str] = []
        try:
            while batch := await transport.fetch([queue], 500, 0.5):
                ids += [d.message.headers["id"] for d in batch]
                await transport.ack(batch)
        finally:
            await transport.disconnect()
            transport.close()
        return ids

    return asyncio.run(run())


def leader_pid(store: SharedStore) -> int | None:
    lease = store.leader()
    return int(lease.holder.split(":")[1]) if lease else None


def test_three_beats_kills_and_an_outage_send_each_due_time_once(
        store_urls: dict[str, str], tmp_path: Path) -> None:
    # The three stores' scenarios run side by side: each has its own processes, files
    # and keys, and spends its time waiting (on leases, an outage), not computing.
    with ThreadPoolExecutor(len(store_urls)) as pool:
        futures = {name: pool.submit(_scenario, url, tmp_path / name)
                   for name, url in store_urls.items()}
    failures = []
    for name, future in futures.items():
        try:
            print(future.result())
        except AssertionError as exc:
            failures.append(f"{name}: {exc}")
    assert not failures, "\n".join(failures)


def _scenario(store_url: str, tmp_path: Path) -> str:
    """Three beats on ``store_url``, two leader kills, an outage; the summary line, or
    AssertionError."""
    tmp_path.mkdir()
    broker = f"sqlite:///{tmp_path / 'broker.db'}"
    env = {"CELERIAC_BROKER_URL": broker, "CELERIAC_RESULT_BACKEND": store_url,
           "CELERIAC_BEAT_LEASE_TIMEOUT": str(LEASE),
           "CELERIAC_BEAT_MAX_LOOP_INTERVAL": "1.0"}
    store = open_store(Settings(broker_url=broker, result_backend=store_url), store_url)
    beats = Beats(env, tmp_path)
    outages: list[tuple[float, float]] = []  # (from, to) unix times with no leader running
    takeovers: list[float] = []

    def ticks() -> list[Run]:
        return [r for r in store.runs() if r.name == "tick"]

    try:
        for _ in range(3):
            beats.start()
        wait_for("3 runs", lambda: len(ticks()) >= 3)
        for _ in range(2):
            pid = wait_for("a leader", lambda: leader_pid(store))
            before = {r.key for r in ticks()}
            killed_at = time.time()
            beats.by_pid(pid).kill()  # SIGKILL: no release, the lease must lapse
            beats.by_pid(pid).wait()

            def successor_sent(pid: int = pid, before: set[str] = before) -> bool:
                return any(r.key not in before and f":{pid}:" not in r.holder
                           for r in ticks())

            wait_for("a successor's run", successor_sent, timeout=LEASE * 4)
            takeovers.append(time.time() - killed_at)
            outages.append((killed_at, time.time()))
            count = len(ticks())
            wait_for("2 more runs", lambda count=count: len(ticks()) >= count + 2)
        beats.stop_all()
        stopped = time.time()
        time.sleep(5)  # sleep-ok: the outage itself: nothing is waited for here
        for _ in range(3):
            beats.start()
        count = len(ticks())
        wait_for("runs after the restart", lambda: len(ticks()) >= count + 3)
        outages.append((stopped, time.time()))
        beats.stop_all()
        # -SIGTERM: a beat still importing when stopped (a loaded machine; its log is
        # empty) dies of the signal's default action before its handler is installed.
        stopped_codes = (0, -signal.SIGKILL, -signal.SIGTERM)
        assert all(p.returncode in stopped_codes for p in beats.procs), beats.logs()
    except BaseException:
        beats.stop_all()
        print(beats.logs())
        raise

    runs = store.runs()
    store.close()
    sent = collections.Counter(drain(broker))
    claimed = {task_id_for(r.name, r.due_ms): r for r in runs}
    doubled = [tid for tid, n in sent.items() if n > 1]
    missing = [r.key for tid, r in claimed.items() if tid not in sent]
    unclaimed = [tid for tid in sent if tid not in claimed]
    # Due times: each later than the one before; a gap of more than one interval only
    # across an outage (policy "once": one run for the windows it missed).
    dues = sorted(r.due_ms for r in runs if r.name == "tick")
    gaps = [b - a for a, b in itertools.pairwise(dues)]
    long_gaps = [g for g in gaps if g > 1000]
    minutes = [r.due_ms for r in runs if r.name == "minute"]
    summary = (f"beat HA on {store_url.split(':')[0]}: {len(dues)} tick runs, "
               f"{len(minutes)} minute runs, doubled {len(doubled)}, missing "
               f"{len(missing)}, takeovers {', '.join(f'{t:.2f}s' for t in takeovers)}, "
               f"long gaps {[g / 1000 for g in long_gaps]}")
    assert doubled == [] and missing == [] and unclaimed == [], summary
    assert all(g % 1000 == 0 for g in gaps) and len(dues) == len(set(dues))
    assert len(long_gaps) <= len(outages)
    assert all(m % 60_000 == 0 for m in minutes) and len(minutes) == len(set(minutes))
    assert all(t < LEASE * 2 for t in takeovers), summary
    return summary
