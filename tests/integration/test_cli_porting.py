"""The commands a Celery user ports to: worker ``-n``/``--logfile``/``--pidfile``,
``report``, ``shell`` and ``multi``, run as a user runs them."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from celeriac import Celeriac, Settings, __version__
from celeriac.cli.pidfile import alive, read_pid
from celeriac.testing import WorkerProcess, wait_until
from tests.integration import app_tasks as t
from tests.integration.conftest import ROOT
from tests.services import require

pytestmark = pytest.mark.slow
APP = "tests.integration.app_tasks"
HOST = socket.gethostname()


def cli(env: dict[str, str], *args: str, input: str | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "celeriac", *args], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=60, input=input, cwd=cwd)


def one_line_error(out: subprocess.CompletedProcess[str], expected: str) -> None:
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], out.stderr


def finished_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(10)
    return proc.pid


# -- worker -n / --logfile / --pidfile --------------------------------------------------

def test_worker_node_name_logfile_and_pidfile(env: dict[str, str], tmp_path: Path,
                                              start_worker: Callable[..., WorkerProcess]
                                              ) -> None:
    w = start_worker("-P", "solo", "-n", "w1@%h", "--logfile", "%n%I.log",
                     "--pidfile", "%n.pid", wait_ready=False)
    log, pidfile = tmp_path / "w1.log", tmp_path / "w1.pid"
    wait_until(lambda: log.exists() and f"w1@{HOST} ready: " in log.read_text(), 15,
               message="ready line in w1.log")
    assert read_pid(pidfile) == w.pid
    assert " ready: " not in w.log  # it went to the file, not to stderr

    second = cli(env, "-A", APP, "worker", "-P", "solo", "-n", "w1@%h", "--pidfile", "%n.pid",
                 cwd=tmp_path)
    one_line_error(second, f"pid file w1.pid names running process {w.pid}")

    assert w.stop() == 0
    assert not pidfile.exists()
    assert f"w1@{HOST} stopped" in log.read_text()


def test_stale_pidfile_is_replaced(tmp_path: Path,
                                   start_worker: Callable[..., WorkerProcess]) -> None:
    pidfile = tmp_path / "w.pid"
    pidfile.write_text(f"{finished_pid()}\n")
    w = start_worker("-P", "solo", "--pidfile", str(pidfile))
    wait_until(lambda: read_pid(pidfile) == w.pid, 10, message="pid file rewritten")
    assert w.stop() == 0
    assert not pidfile.exists()


def test_bad_format_is_a_usage_error(env: dict[str, str]) -> None:
    out = cli(env, "-A", APP, "worker", "--logfile", "%q.log")
    assert out.returncode == 2 and "unknown format %q in '%q.log'" in out.stderr


# -- report -----------------------------------------------------------------------------

SECRETS = ("Sup3rS3cret", "hunter2", "AKIA-not-a-key", "sentinel-pw", "pa/ss")


def test_report_never_prints_a_secret(env: dict[str, str]) -> None:
    out = cli({
        **env,
        "CELERIAC_BROKER_URL": "redis://admin:Sup3rS3cret@127.0.0.1:6379/0;"
                               "redis://admin:pa/ss@127.0.0.2:6379/0",
        "CELERIAC_RESULT_BACKEND": "redis://127.0.0.1:6379/1?password=hunter2",
        "CELERIAC_BROKER_TRANSPORT_OPTIONS":
            "api_key=AKIA-not-a-key,master_name=mymaster,sentinel=redis://:sentinel-pw@h:26379",
    }, "-A", APP, "report")
    assert out.returncode == 0, out.stderr
    for secret in SECRETS:
        assert secret not in out.stdout + out.stderr
    text = out.stdout
    assert f"celeriac:{__version__}" in text and f"{sys.version_info[0]}." in text
    assert f"redis:{importlib.metadata.version('redis')}" in text
    assert "broker   -> redis://admin:***@127.0.0.1:6379/0;redis://admin:***@" in text
    assert "results  -> redis://127.0.0.1:6379/1?password=***" in text
    assert "'api_key': '********'" in text and "'master_name': 'mymaster'" in text
    assert "'sentinel': 'redis://:***@h:26379'" in text
    assert "task_default_queue: 'celery'" in text  # every setting is listed


# -- shell ------------------------------------------------------------------------------

SCRIPT = "print(app is celery, add.name, celeriac.__version__)\nprint(whoami_bound.name)\n"


def test_plain_python_shell(env: dict[str, str]) -> None:
    out = cli(env, "-A", APP, "shell", "--python", input=SCRIPT)
    assert out.returncode == 0, out.stderr
    assert f"True {APP}.add {__version__}" in out.stdout
    assert f"{APP}.whoami_bound" in out.stdout
    assert "Available: AsyncResult, Task, add," in out.stderr


def test_shell_without_tasks(env: dict[str, str]) -> None:
    out = cli(env, "-A", APP, "shell", "--python", "-T", input="print(add)\n")
    assert "NameError: name 'add' is not defined" in out.stderr


def test_shell_falls_back_to_python(env: dict[str, str]) -> None:
    if importlib.util.find_spec("IPython") or importlib.util.find_spec("bpython"):
        pytest.skip("IPython or bpython is installed")
    out = cli(env, "-A", APP, "shell", input=SCRIPT)
    assert f"True {APP}.add" in out.stdout
    one_line_error(cli(env, "-A", APP, "shell", "--ipython", input=""),
                   "IPython is not installed")


# -- multi ------------------------------------------------------------------------------

@pytest.fixture
def redis_env() -> Iterator[dict[str, str]]:
    """Settings of a namespace of this test's own on the shared Redis (keys deleted after)."""
    ns = f"m{uuid.uuid4().hex[:12]}"
    yield {
        "CELERIAC_BROKER_URL": f"{require('redis')}?namespace={ns}",
        "CELERIAC_WORKER_PREFETCH_MULTIPLIER": "1",  # a busy worker leaves the next task
        "PYTHONPATH": str(ROOT),
    }
    admin = redis.Redis()
    keys = list(admin.scan_iter(match=f"{ns}*", count=1000))
    if keys:
        admin.delete(*keys)
    admin.close()


@pytest.fixture
def redis_app(redis_env: dict[str, str]) -> Iterator[Celeriac]:
    before = t.app.settings
    t.app.close()
    t.app.settings = Settings.from_env(redis_env)
    yield t.app
    t.app.close()
    t.app.settings = before


@pytest.fixture
def multi(redis_env: dict[str, str], tmp_path: Path
          ) -> Iterator[Callable[..., subprocess.CompletedProcess[str]]]:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return cli(redis_env, "-A", APP, "multi", *args, cwd=tmp_path)

    yield run
    run("kill", "w1", "w2")  # whatever a failed test left running


def test_multi_start_run_tasks_stopwait(redis_app: Celeriac, tmp_path: Path,
                                        multi: Callable[..., subprocess.CompletedProcess[str]]
                                        ) -> None:
    shown = multi("show", "w1", "w2", "-P", "solo", "-l", "info")
    assert shown.stdout.splitlines()[0].endswith(
        f"-A {APP} worker -n w1@{HOST} --pidfile w1.pid --logfile w1%I.log -P solo -l info")

    started = multi("start", "w1", "w2", "-P", "solo", "-l", "info", "--timeout", "20")
    assert started.returncode == 0, (started.stdout, started.stderr)
    pids = {name: read_pid(tmp_path / f"{name}.pid") for name in ("w1", "w2")}
    assert all(pid and alive(pid) for pid in pids.values()), pids
    assert f"w1@{HOST}: OK (pid {pids['w1']})" in started.stdout

    again = multi("start", "w1", "-P", "solo")
    assert f"w1@{HOST}: already running (pid {pids['w1']})" in again.stdout

    # Each task holds its solo worker for a while; with a prefetch of one the other
    # worker gets the next. Rounds until both have run one, bounded by the deadline.
    ran: set[int] = set()

    def both_ran() -> bool:
        markers = [tmp_path / f"m{uuid.uuid4().hex}" for _ in range(2)]
        results = [t.sleep.delay(0.3, str(m)) for m in markers]
        for r in results:
            r.get(timeout=20)
        ran.update(int(m.read_text()) for m in markers)
        return ran == set(pids.values())

    wait_until(both_ran, 30, interval=0, message="both workers ran a task")

    stopped = multi("stopwait", "w1", "w2", "--timeout", "20")
    assert stopped.returncode == 0, stopped.stdout
    assert f"w1@{HOST}: TERM -> {pids['w1']}" in stopped.stdout
    assert f"w2@{HOST}: OK" in stopped.stdout
    assert not any(alive(pid) for pid in pids.values() if pid)
    assert not (tmp_path / "w1.pid").exists() and not (tmp_path / "w2.pid").exists()
    for name in ("w1", "w2"):
        log = (tmp_path / f"{name}.log").read_text()
        assert f"{name}@{HOST} ready" in log and f"{name}@{HOST} stopped" in log

    assert f"w1@{HOST}: DOWN" in multi("stop", "w1").stdout


def test_multi_restart_and_stale_pidfile(redis_app: Celeriac, tmp_path: Path,
                                         multi: Callable[..., subprocess.CompletedProcess[str]]
                                         ) -> None:
    (tmp_path / "w1.pid").write_text(f"{finished_pid()}\n")  # a killed worker's leftover
    assert multi("start", "w1", "-P", "solo").returncode == 0
    first = read_pid(tmp_path / "w1.pid")
    assert first and alive(first)

    restarted = multi("restart", "w1", "-P", "solo", "--timeout", "20")
    assert restarted.returncode == 0, restarted.stdout
    second = read_pid(tmp_path / "w1.pid")
    assert second and second != first and alive(second) and not alive(first)
    assert t.add.delay(2, 3).get(timeout=20) == 5

    assert multi("kill", "w1").returncode == 0
    wait_until(lambda: not alive(second), 10, message="killed worker gone")
    assert not (tmp_path / "w1.pid").exists()


def test_multi_start_failure_is_reported(tmp_path: Path) -> None:
    env = {"CELERIAC_BROKER_URL": "redis://127.0.0.1:1/0",
           "CELERIAC_BROKER_CONNECTION_MAX_RETRIES": "0", "PYTHONPATH": str(ROOT)}
    out = cli(env, "-A", APP, "multi", "start", "w1", "-P", "solo", cwd=tmp_path)
    assert out.returncode == 1
    assert f"w1@{HOST}: FAILED (exit status 1; see w1.log)" in out.stdout
    assert "BrokerUnavailable" in (tmp_path / "w1.log").read_text()
    assert not (tmp_path / "w1.pid").exists()


def test_multi_usage_errors(tmp_path: Path) -> None:
    for args, expected in [((), "give at least one node name"),
                           (("w1", "--bogus"), "no such worker option: --bogus"),
                           (("w1", "-n", "x"), "node names are the NAME arguments")]:
        out = cli({}, "multi", "start", *args, cwd=tmp_path)
        assert out.returncode == 2 and expected in out.stderr
    names = cli({}, "multi", "names", "3", cwd=tmp_path)
    assert names.stdout.split() == [f"celeriac{i}@{HOST}" for i in (1, 2, 3)]
