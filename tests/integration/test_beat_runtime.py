"""Beat at runtime: entries added, disabled, enabled and removed through the CLI while
a beat runs (Redis store), ``celeriac beat run``, and ``celeriac worker -B``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from celeriac import Settings
from celeriac.beat.service import task_id_for
from celeriac.stores import open_store
from tests.contracts.conftest import _drop_redis_namespace
from tests.integration.test_beat_ha import ROOT, Beats, drain, wait_for
from tests.services import require

pytestmark = pytest.mark.slow


def cli(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celeriac", "-A", "tests.integration.beat_app", "beat", *args],
        env={**os.environ, **env, "PYTHONPATH": str(ROOT)}, cwd=cwd, capture_output=True,
        text=True, timeout=30)


def test_entries_change_while_a_beat_runs(tmp_path: Path) -> None:
    url = f"{require('redis')}?namespace=b{os.urandom(5).hex()}"
    broker = f"sqlite:///{tmp_path / 'broker.db'}"
    env = {"CELERIAC_BROKER_URL": broker, "CELERIAC_RESULT_BACKEND": url,
           "CELERIAC_BEAT_MAX_LOOP_INTERVAL": "0.5", "BEAT_ENTRIES": "none"}
    store = open_store(Settings(result_backend=url), url)
    beats = Beats(env, tmp_path)

    def count(name: str) -> int:
        return sum(r.name == name for r in store.runs())

    def settle() -> None:
        """Wait until the beat has surely read the store again: two more marker runs."""
        n = count("marker")
        wait_for("two marker runs", lambda: count("marker") >= n + 2)

    try:
        beats.start()
        for args in (("marker", "beat.record", "1", "--args", '["marker"]'),
                     ("fast", "beat.record", "1s", "--args", '["fast"]',
                      "--options", '{"expires": 30}')):
            done = cli(env, tmp_path, "add", *args)
            assert done.returncode == 0, done.stderr
        wait_for("fast runs", lambda: count("fast") >= 2)
        listed = json.loads(cli(env, tmp_path, "list", "--json").stdout)
        fast = next(e for e in listed["entries"] if e["name"] == "fast")
        assert fast["enabled"] and fast["options"] == {"expires": 30} and fast["last_run"]
        assert listed["leader"]["beat"].startswith("beat@")

        assert cli(env, tmp_path, "disable", "fast").returncode == 0
        stopped_at = count("fast")
        settle()
        assert count("fast") <= stopped_at + 1  # at most the tick already under way
        paused = count("fast")
        settle()
        assert count("fast") == paused

        assert cli(env, tmp_path, "enable", "fast").returncode == 0
        wait_for("fast runs again", lambda: count("fast") >= paused + 2)

        assert cli(env, tmp_path, "remove", "fast").returncode == 0
        removed_at = count("fast")
        settle()
        assert count("fast") <= removed_at + 1
        names = [e["name"] for e in json.loads(cli(env, tmp_path, "list", "--json").stdout)
                 ["entries"]]
        assert names == ["marker"]
        missing = cli(env, tmp_path, "remove", "fast")
        assert missing.returncode == 1 and "no beat entry named 'fast'" in missing.stderr

        ran = cli(env, tmp_path, "run", "marker")
        assert ran.returncode == 0, ran.stderr
        manual_id = ran.stdout.strip()
        table = cli(env, tmp_path, "list").stdout
        assert "marker" in table and "leader: beat@" in table
    except BaseException:
        print(beats.logs())
        raise
    finally:
        beats.stop_all()
        store.close()
        _drop_redis_namespace(url)
    assert all(p.returncode == 0 for p in beats.procs), beats.logs()
    sent = drain(broker)
    assert manual_id in sent
    assert len(sent) == len(set(sent))


def test_worker_with_embedded_beat_runs_periodic_tasks(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'celeriac.db'}"
    record = tmp_path / "record.txt"
    env = {**os.environ, "CELERIAC_BROKER_URL": db, "BEAT_RECORD": str(record),
           "CELERIAC_BEAT_LEASE_TIMEOUT": "2", "PYTHONPATH": str(ROOT)}
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celeriac", "-A", "tests.integration.beat_app", "worker",
             "-B", "-P", "solo", "-l", "info"], env=env, cwd=tmp_path, stdout=out,
            stderr=out)
    try:
        def ticks() -> list[str]:
            lines = record.read_text().splitlines() if record.exists() else []
            return [line.split()[1] for line in lines if line.startswith("tick ")]

        ids = wait_for("3 periodic runs executed", lambda: ticks() if len(ticks()) >= 3
                       else None, timeout=20)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=20) == 0, log.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    store = open_store(Settings(broker_url=db))
    runs = {task_id_for(r.name, r.due_ms) for r in store.runs()}
    assert store.leader() is None  # released on the way out
    store.close()
    assert set(ids) <= runs and len(ids) == len(set(ids))
    assert "leads now" in log.read_text()
