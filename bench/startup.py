"""Start-up (issue 30): ``import``, ``--help`` and a worker's boot, celeriac against Celery
(and Dramatiq's and Huey's imports where their virtualenvs exist), as medians of several
runs (``bench/run.py --startup``, or ``python bench/startup.py``).

- **import**: ``python -X importtime -c CODE``, the sum of the top-level imports that
  ``python -c pass`` does not make, in ms; for celeriac both ``import celeriac`` and
  what a producer runs first, ``from celeriac import Celeriac``.
- **--help**: the process's wall time for ``celeriac --help`` / ``celery --help``.
- **worker ready**: one I/O task (an INCR) is queued, then the worker is started
  (``worker --pool prefork -c 2`` on Redis, default settings); the time from just
  before the exec to the INCR seen by a 2 ms poll. The worker has run its first task.

celeriac is measured twice: in the development virtualenv (``.venv``, with every extra
the test suite needs: OpenTelemetry's SDK among them, which redis-py imports whenever it
is installed) and as a user installs it, ``pip install celeriac[redis]``, in
``bench/.venv-celeriac`` (made on first use, the source tree installed editable), as
Celery is measured in ``bench/.venv-celery`` with ``celery[redis]``: the like-for-like
row, which the targets judge.

Every child runs with bytecode cached in a temporary ``PYTHONPYCACHEPREFIX`` (as an
installed package has its ``.pyc``; this machine's ``PYTHONDONTWRITEBYTECODE=1`` would
otherwise compile every module on every run), after one untimed warm-up.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tasks as bench_tasks
from harness import (
    CELERIAC_REDIS_DB,
    CELERIAC_REDIS_URL,
    HERE,
    LIVE,
    PEERS,
    PEERS_DIR,
    BenchError,
    console,
    flush_redis_db,
    io_counter,
    machine_lock,
    require_redis,
    run_bounded,
    stop_process,
)

RUNS = 7
WORKER_RUNS = 3
READY_TIMEOUT = 30.0
POLL = 0.002
Row = dict[str, float | None]


def child_env(pycache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CELERIAC_") and k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPYCACHEPREFIX=str(pycache), **extra)
    return env


def venv_python(key: str) -> Path | None:
    """A peer's interpreter, ``bench/.venv-<key>``, or None where it was never made."""
    path = HERE / f".venv-{key}" / "bin" / "python"
    return path if path.exists() else None


def import_ms(python: str, code: str, env: dict[str, str], runs: int) -> float:
    """Median over ``runs`` of the top-level imports ``code`` makes, by ``-X importtime``."""

    def tops(source: str) -> dict[str, int]:
        err = subprocess.run([python, "-X", "importtime", "-c", source], env=env, timeout=60,
                             capture_output=True, text=True, check=True).stderr
        out: dict[str, int] = {}
        for line in err.splitlines():
            parts = line.split("|")
            if len(parts) == 3 and not parts[2].startswith("  ") and parts[1].strip().isdigit():
                out[parts[2].strip()] = int(parts[1])
        return out

    startup = set(tops("pass"))
    tops(code)  # warm-up: writes the bytecode cache
    totals = [sum(us for name, us in tops(code).items() if name not in startup)
              for _ in range(runs)]
    return statistics.median(totals) / 1000


def wall_ms(argv: list[str], env: dict[str, str], runs: int, cwd: Path = HERE) -> float:
    subprocess.run(argv, env=env, cwd=cwd, timeout=60, capture_output=True, check=True)
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        subprocess.run(argv, env=env, cwd=cwd, timeout=60, capture_output=True, check=True)
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000


def ready_s(argv: list[str], env: dict[str, str], cwd: Path, key: str, log: Path) -> float:
    """Start the worker (a task already queued for it), return the seconds to its INCR."""
    counter = io_counter()
    try:
        with open(log, "ab") as out:
            began = time.perf_counter()
            proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        LIVE.add(proc)
        try:
            while not counter.get(key):
                if proc.poll() is not None:
                    raise BenchError(f"{argv[0]} worker exited ({proc.returncode}); see {log}")
                if time.perf_counter() - began > READY_TIMEOUT:
                    raise BenchError(f"{argv[0]} worker ran nothing in {READY_TIMEOUT:.0f}s")
                time.sleep(POLL)
            return time.perf_counter() - began
        finally:
            stop_process(proc)
    finally:
        counter.delete(key)
        counter.close()


USER_EXTRAS = "redis"
"""What ``bench/.venv-celeriac`` installs: ``celeriac[redis]``, as a user on Redis does."""
SETUP_TIMEOUT = 600.0


def user_venv() -> Path:
    """``bench/.venv-celeriac``'s interpreter: this tree installed editable with the
    ``redis`` extra only (made on first use; again when the extras change)."""
    path = HERE / ".venv-celeriac"
    python, stamp = path / "bin" / "python", path / ".bench-installed"
    wanted = f"{HERE.parent}[{USER_EXTRAS}]"
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    console.print(f"setting up bench/.venv-celeriac (first run): pip install -e {wanted} ...")
    shutil.rmtree(path, ignore_errors=True)
    deadline = time.monotonic() + SETUP_TIMEOUT
    base = shutil.which("python3") or sys.executable
    log_path = path.with_name(".venv-celeriac.log")
    with open(log_path, "wb") as log:
        run_bounded([base, "-m", "venv", str(path)], deadline, log)
        run_bounded([str(python), "-m", "pip", "install", "-q",
                     "--disable-pip-version-check", "-e", wanted], deadline, log)
    stamp.write_text(wanted)
    log_path.unlink(missing_ok=True)
    return python


def celeriac_row(pycache: Path, runs: int, worker_runs: int, workdir: Path,
                 python: str | None = None) -> Row:
    py = python or sys.executable
    env = child_env(pycache)
    exe = Path(py).with_name("celeriac")
    cli = [str(exe)] if exe.exists() else [py, "-m", "celeriac"]
    row: Row = {
        "import": import_ms(py, "import celeriac", env, runs),
        "producer import": import_ms(py, "from celeriac import Celeriac", env, runs),
        "--help": wall_ms([*cli, "--help"], env, runs),
        "worker ready": None,
    }
    if worker_runs:
        require_redis()
        app, _ = bench_tasks.make_app(CELERIAC_REDIS_URL)
        path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
        wenv = child_env(pycache, CELERIAC_BROKER_URL=CELERIAC_REDIS_URL, PYTHONPATH=path)
        argv = [*cli, "-A", "tasks", "worker", "--pool", "prefork", "-c", "2", "-l", "warning"]
        times = []
        for i in range(worker_runs + 1):  # the first is the warm-up
            flush_redis_db(CELERIAC_REDIS_DB)
            key = f"startup-{uuid.uuid4().hex}"
            app.tasks[bench_tasks.IO].delay(key)
            took = ready_s(argv, wenv, workdir, key, workdir / "celeriac-worker.log")
            if i:
                times.append(took)
        app.close()
        row["worker ready"] = statistics.median(times) * 1000
    return row


def celery_row(pycache: Path, runs: int, worker_runs: int, workdir: Path) -> Row | None:
    py = venv_python("celery")
    if py is None:
        return None
    env = child_env(pycache, PYTHONPATH=str(PEERS_DIR))
    row: Row = {
        "import": import_ms(str(py), "import celery", env, runs),
        "producer import": import_ms(str(py), "from celery import Celery", env, runs),
        "--help": wall_ms([str(py.with_name("celery")), "--help"], env, runs),
        "worker ready": None,
    }
    if worker_runs:
        peer = PEERS["celery"]
        argv = [str(py.with_name(peer.worker[0])), *peer.worker[1:]]
        times = []
        for i in range(worker_runs + 1):
            flush_redis_db(peer.redis_db)
            key = f"startup-{uuid.uuid4().hex}"
            send = (f"import celery_app; celery_app.app.send_task('bench.io', args=[{key!r}], "
                    "ignore_result=True)")
            subprocess.run([str(py), "-c", send], env=env, cwd=PEERS_DIR, timeout=60,
                           capture_output=True, check=True)
            took = ready_s(argv, env, PEERS_DIR, key, workdir / "celery-worker.log")
            if i:
                times.append(took)
        row["worker ready"] = statistics.median(times) * 1000
    return row


def measure(runs: int = RUNS, worker_runs: int = WORKER_RUNS) -> dict[str, Row]:
    """Each system's row (ms; None where not measured)."""
    rows: dict[str, Row] = {}
    with tempfile.TemporaryDirectory(prefix="celeriac-startup-") as tmp:
        pycache, workdir = Path(tmp) / "pycache", Path(tmp)
        rows["celeriac"] = celeriac_row(pycache, runs, worker_runs, workdir,
                                        str(user_venv()))
        rows["celeriac dev"] = celeriac_row(pycache, runs, worker_runs, workdir)
        celery = celery_row(pycache, runs, worker_runs, workdir)
        if celery is not None:
            rows["Celery"] = celery
        for key, label in (("dramatiq", "Dramatiq"), ("huey", "Huey")):
            if (py := venv_python(key)) is not None:
                env = child_env(pycache, PYTHONPATH=str(PEERS_DIR))
                rows[label] = {"import": import_ms(str(py), f"import {key}", env, runs),
                               "producer import": None, "--help": None, "worker ready": None}
    return rows


def table(rows: dict[str, Row]) -> str:
    cols = ("import", "producer import", "--help", "worker ready")
    lines = ["start-up, medians in ms (targets: import <= 80, --help <= 150, worker ready "
             "<= 250; celeriac: pip install celeriac[redis], as Celery's celery[redis]; "
             "celeriac dev: the development virtualenv, every extra and OpenTelemetry's "
             "SDK)", f"{'system':<13}" + "".join(f"{c:>17}" for c in cols)]
    for name, row in rows.items():
        cells = "".join(f"{row[c]:>17.1f}" if row[c] is not None else f"{'-':>17}"
                        for c in cols)
        lines.append(f"{name:<13}{cells}")
    return "\n".join(lines)


def show(rows: dict[str, Row] | None) -> None:
    if rows:
        console.print(table(rows), markup=False)


def measure_if(wanted: bool, runs: int) -> dict[str, Row] | None:
    return measure(runs=max(runs, 5), worker_runs=max(runs, 3)) if wanted else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=RUNS, help="runs per figure (default 7)")
    parser.add_argument("--worker-runs", type=int, default=WORKER_RUNS,
                        help="worker boots per system, 0 for none (default 3)")
    parser.add_argument("--lock-timeout", type=float, default=600.0)
    opts = parser.parse_args(argv)
    if opts.runs < 1 or opts.worker_runs < 0:
        parser.error("--runs must be >= 1 and --worker-runs >= 0")
    try:
        with machine_lock(opts.lock_timeout):
            show(measure(opts.runs, opts.worker_runs))
    except BenchError as exc:
        console.print(f"[red]{exc}[/]")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
