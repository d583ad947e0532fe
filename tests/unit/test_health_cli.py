"""``celeriac health``: green for a fresh health file naming a live pid; red, with the
reason on stderr, for a stale file, a missing one, a dead pid, or a pid file that
disagrees. No broker is involved (the app's broker URL here is unreachable)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from celeriac.cli import main
from celeriac.cli.health import Unhealthy, check
from celeriac.worker.health import write_health_file


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["health", *args])
    return result.exit_code, result.stdout, result.stderr


def test_fresh_file_with_a_live_pid_is_green(tmp_path: Path) -> None:
    path = tmp_path / "w1.health"
    write_health_file(str(path))
    code, out, err = run("--health-file", str(path))
    assert code == 0, err
    assert f"worker {os.getpid()}" in out


def test_the_node_name_picks_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write_health_file("w1.health")
    assert run("-n", "w1@%h")[0] == 0
    code, _, err = run("-n", "w2@%h")
    assert code == 1 and "w2.health is missing" in err


def test_stale_file_is_red_and_says_how_long_the_loop_has_not_turned(tmp_path: Path) -> None:
    path = tmp_path / "w1.health"
    write_health_file(str(path))
    old = time.time() - 42
    os.utime(path, (old, old))
    code, _, err = run("--health-file", str(path), "--max-age", "15")
    assert code == 1
    assert "loop has not turned for 42 s" in err
    assert run("--health-file", str(path), "--max-age", "60")[0] == 0


def test_default_max_age_is_three_health_intervals(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "w1.health"
    write_health_file(str(path))
    old = time.time() - 10
    os.utime(path, (old, old))
    assert run("--health-file", str(path))[0] == 0  # 3 x 5 s
    monkeypatch.setenv("CELERIAC_WORKER_HEALTH_INTERVAL", "2")
    assert run("--health-file", str(path))[0] == 1  # 3 x 2 s


def test_dead_pid_is_red(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    path = tmp_path / "w1.health"
    path.write_text(f"{proc.pid}\n")
    code, _, err = run("--health-file", str(path))
    assert code == 1 and f"worker pid {proc.pid}" in err and "is not running" in err


def test_missing_and_garbage_files_are_red(tmp_path: Path) -> None:
    code, _, err = run("--health-file", str(tmp_path / "none.health"))
    assert code == 1 and "is missing" in err and "--health-file" in err
    (tmp_path / "bad.health").write_text("hello\n")
    code, _, err = run("--health-file", str(tmp_path / "bad.health"))
    assert code == 1 and "does not hold a pid" in err


def test_pidfile_must_name_the_same_process(tmp_path: Path) -> None:
    path, pidfile = tmp_path / "w.health", tmp_path / "w.pid"
    write_health_file(str(path))
    pidfile.write_text(f"{os.getpid()}\n")
    assert check(str(path), 10, str(pidfile)) == os.getpid()
    pidfile.write_text("1\n")
    with pytest.raises(Unhealthy, match="names 1"):
        check(str(path), 10, str(pidfile))
    pidfile.unlink()
    with pytest.raises(Unhealthy, match=r"pid file .* is missing"):
        check(str(path), 10, str(pidfile))
