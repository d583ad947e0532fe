"""Faults of the SQLite file itself, and values nested too deeply: each is one clear line
naming the file (or the argument) and why, never a raw ``sqlite3`` traceback or a lost
task.

Read-only as root: ``chmod`` does not stop root from writing, so a root run makes the file
read-only the way SQLite itself honours for everyone: a write version above 2 in the
database header (byte 18) makes SQLite refuse every write with "attempt to write a
readonly database", the same error a non-root user gets from a ``chmod 444`` file. A
read-only directory as root is ``chattr +i`` (an immutable directory: no new -wal/-shm);
where that is refused (no CAP_LINUX_IMMUTABLE, a filesystem without it) that case skips.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from celeriac import Celeriac, EncodeError, OperationalError, Settings
from celeriac.testing import WorkerProcess, wait_until
from tests.integration import faults_tasks as t

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parent.parent.parent
APP = "tests.integration.faults_tasks"
AS_ROOT = os.geteuid() == 0


def _env(db: Path) -> dict[str, str]:
    return {"CELERIAC_BROKER_URL": f"sqlite:///{db}", "CELERIAC_WORKER_LEASE_TIMEOUT": "1.0",
            "PYTHONPATH": str(ROOT)}


@contextmanager
def _bound(env: dict[str, str]) -> Iterator[Celeriac]:
    before = t.app.settings
    t.app.close()
    t.app.settings = Settings.from_env(env)
    try:
        yield t.app
    finally:
        t.app.close()
        t.app.settings = before


def _create(db: Path) -> None:
    """The broker's file with its tables, closed (no -wal/-shm left beside it)."""
    db.parent.mkdir(parents=True, exist_ok=True)
    with _bound(_env(db)) as app:
        app.transport.ping()


@contextmanager
def _read_only_file(db: Path) -> Iterator[None]:
    if AS_ROOT:
        with open(db, "r+b") as f:  # the header's write version: > 2 is read-only
            f.seek(18)
            f.write(b"\x03")
        yield
        return
    db.chmod(0o444)
    try:
        yield
    finally:
        db.chmod(0o644)


@contextmanager
def _read_only_dir(directory: Path) -> Iterator[None]:
    if not AS_ROOT:
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(0o755)
        return
    chattr = shutil.which("chattr")
    if chattr is None:
        pytest.skip("running as root without chattr: no way to make a directory read-only")
    made = subprocess.run([chattr, "+i", str(directory)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"running as root and chattr +i is refused here ({made.stderr.strip()}):"
                    " no way to make a directory read-only")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(directory)], check=True)


def _worker(env: dict[str, str], cwd: Path, *args: str) -> WorkerProcess:
    return WorkerProcess(APP, "-c", "1", *args, env=env, cwd=str(cwd))


@pytest.mark.parametrize("what", ["file", "directory"])
def test_worker_on_a_read_only_database_exits_with_one_line(tmp_path: Path, what: str) -> None:
    db = tmp_path / "broker" / "celeriac.db"
    _create(db)
    read_only = _read_only_file(db) if what == "file" else _read_only_dir(db.parent)
    with read_only:
        w = _worker(_env(db), tmp_path).start(wait_ready=False)
        try:
            code = w.wait(30)
        finally:
            w.kill()
    assert code != 0, w.log
    assert "Traceback" not in w.log, w.log
    lines = [line for line in w.log.splitlines() if "read-only" in line]
    assert len(lines) == 1, w.log
    assert f"broker database {db} is read-only (" in lines[0]
    if what == "directory":
        assert f"its directory {db.parent} is not writable" in lines[0]


def test_producer_on_a_read_only_database_names_the_file(tmp_path: Path) -> None:
    db = tmp_path / "celeriac.db"
    _create(db)
    said = f"broker database {db} is read-only (attempt to write a readonly database)"
    with (_read_only_file(db), _bound(_env(db)),
          pytest.raises(OperationalError, match=re.escape(said))):
        t.add.delay(1, 2)


@pytest.mark.parametrize("how", ["directory-deleted", "file-replaced"])
def test_worker_whose_database_goes_away_stops(tmp_path: Path, how: str) -> None:
    db = tmp_path / "broker" / "celeriac.db"
    _create(db)
    w = _worker(_env(db), tmp_path).start()
    try:
        if how == "directory-deleted":
            shutil.rmtree(db.parent)
            said = (f"broker database {db} was deleted (or moved away) while in use, and so "
                    f"was its directory {db.parent}")
        else:
            other = db.with_name("other.db")
            sqlite3.connect(other).close()
            os.replace(other, db)
            said = f"broker database {db} was replaced by another file while in use"
        code = w.wait(30)
    finally:
        w.kill()
    assert code != 0, w.log
    # Its line saying it stopped says why.
    stopped = [line for line in w.log.splitlines() if " stopped: " in line]
    assert len(stopped) == 1 and said in stopped[0], w.log


def test_a_result_nested_too_deeply_is_a_clear_failure(tmp_path: Path) -> None:
    env = {**_env(tmp_path / "celeriac.db"), "CELERIAC_RESULT_BACKEND": "sqlite:///"
           f"{tmp_path}/celeriac.db"}
    with _bound(env):
        # -l info: the worker logs each result, which must not take it down either.
        w = WorkerProcess(APP, "-c", "1", env=env, cwd=str(tmp_path), loglevel="info")
        w.start(wait_ready=False)
        try:
            deep = t.nested.delay(10_000)
            fine = t.nested.delay(100)
            with pytest.raises(EncodeError, match=r"cannot store result: .*nested too "
                                                  r"deeply: over the 254 levels"):
                deep.get(timeout=30)
            assert deep.state == "FAILURE"
            wait_until(lambda: fine.ready(), 30, message="the next task's result")
            assert fine.get(timeout=1) is not None
            assert w.proc is not None and w.proc.poll() is None, w.log
        finally:
            w.kill()


def test_an_argument_nested_too_deeply_names_it(tmp_path: Path) -> None:
    deep: list[object] = []
    for _ in range(9_999):
        deep = [deep]
    with _bound(_env(tmp_path / "celeriac.db")) as app:
        with pytest.raises(EncodeError, match="argument 1 is nested too deeply: 10000 levels "
                                              "of lists and dicts, over the 252 the 'json' "
                                              "serializer encodes in a task's argument"):
            t.add.delay(1, deep)  # type: ignore[arg-type]
        assert app.transport.queue_length("celery") == 0
