"""The ``celeriac`` command, run as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from celeriac import Celeriac, __version__
from celeriac.testing import WorkerProcess
from tests.integration import app_tasks as t

pytestmark = pytest.mark.slow
APP = "tests.integration.app_tasks"


def cli(env: dict[str, str], *args: str, input: str | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([sys.executable, "-m", "celeriac", *args], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=30, input=input, cwd=cwd)


def test_version(env: dict[str, str]) -> None:
    out = cli(env, "--version")
    assert out.returncode == 0 and __version__ in out.stdout


def test_call_and_result(app: Celeriac, env: dict[str, str],
                         start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker()
    out = cli(env, "-A", APP, "call", f"{APP}.add", "--args", "[2, 3]", "--wait", "10")
    assert out.returncode == 0, out.stderr
    task_id, value = out.stdout.split()
    assert value == "5"
    shown = cli(env, "-A", APP, "result", task_id)
    assert shown.stdout.strip() == "SUCCESS 5"
    assert cli(env, "-A", APP, "result", "no-such-id").stdout.strip() == "PENDING"


def test_call_rejects_bad_json(env: dict[str, str]) -> None:
    out = cli(env, "-A", APP, "call", f"{APP}.add", "--args", "[2,")
    assert out.returncode == 2
    assert "--args" in out.stderr and "not valid JSON" in out.stderr


def test_purge_asks_unless_forced(app: Celeriac, env: dict[str, str]) -> None:
    for i in range(3):
        t.add.delay(i, i)
    declined = cli(env, "-A", APP, "purge", input="n\n")
    assert "Purge 3 message(s) from celery?" in declined.stdout
    assert declined.returncode == 1 and app.transport.queue_length("celery") == 3
    forced = cli(env, "-A", APP, "purge", "-f")
    assert forced.returncode == 0 and "purged 3 message(s)" in forced.stdout
    assert app.transport.queue_length("celery") == 0


@pytest.mark.parametrize(
    ("args", "extra_env", "expected"),
    [
        (["-A", "no_such_module", "worker"], {}, "cannot import app module 'no_such_module'"),
        (["-A", APP, "worker"], {"CELERIAC_BROKER_URL": "kafka://x"},
         "unknown broker URL scheme 'kafka'"),
        (["-A", APP, "worker"], {"CELERIAC_BROKER_URL": "sqlite:////nonexistent/dir/x.db"},
         "BrokerUnavailable: cannot open SQLite database"),
        (["-A", APP, "worker"], {"CELERIAC_WORKER_PREFETCH_MULTIPLIER": "zero"},
         "CELERIAC_WORKER_PREFETCH_MULTIPLIER='zero' is not a valid"),
    ],
    ids=["unknown-module", "bad-scheme", "unreachable-broker", "bad-setting"],
)
def test_errors_are_one_clear_line(env: dict[str, str], args: list[str],
                                   extra_env: dict[str, str], expected: str) -> None:
    out = cli({**env, **extra_env}, *args)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr
    assert expected in lines[0]


def test_beat_scheduler_option_names_what_it_accepts(env: dict[str, str]) -> None:
    # django-celery-beat's docs start beat with --scheduler; a scheduler we cannot honour
    # is refused before the beat starts, naming the option and what it takes.
    out = cli(env, "-A", APP, "beat", "-S", "myproj.schedulers:Custom")
    assert out.returncode == 2
    assert "Invalid value for --scheduler" in out.stderr
    assert "django_celery_beat.schedulers:DatabaseScheduler" in out.stderr


def test_dead_letter_commands(app: Celeriac, env: dict[str, str],
                              start_worker: Callable[..., WorkerProcess]) -> None:
    from celeriac.testing import wait_until

    w = start_worker()
    app.send_task("no.such.task", [1])
    wait_until(app.transport.dead_letters, 10)
    listed = cli(env, "-A", APP, "dead", "list")
    assert listed.returncode == 0 and "unknown task 'no.such.task'" in listed.stdout
    dead_id = str(app.transport.dead_letters()[0].id)
    shown = cli(env, "-A", APP, "dead", "show", dead_id)
    assert '"task": "no.such.task"' in shown.stdout and '"body": "[[1],' in shown.stdout
    app.send_task("no.such.task", ["zipped"], compression="bzip2")
    wait_until(lambda: len(app.transport.dead_letters()) == 2, 10)
    zipped = next(str(d.id) for d in app.transport.dead_letters() if str(d.id) != dead_id)
    shown = cli(env, "-A", APP, "dead", "show", zipped)
    assert '"compression": "application/x-bz2"' in shown.stdout  # shown decompressed:
    assert '"body": "[[\\"zipped\\"],' in shown.stdout
    cli(env, "-A", APP, "dead", "purge", "-f", zipped)
    assert cli(env, "-A", APP, "dead", "show", "999999").returncode == 1
    requeued = cli(env, "-A", APP, "dead", "requeue", dead_id)
    assert "requeued 1 message(s)" in requeued.stdout
    # The worker dead-letters it again (still unknown): the round trip works.
    wait_until(lambda: len(app.transport.dead_letters()) == 1 and
               str(app.transport.dead_letters()[0].id) != dead_id, 10)
    purged = cli(env, "-A", APP, "dead", "purge", "-f")
    assert "deleted 1 dead letter(s)" in purged.stdout
    assert app.transport.dead_letters() == []
    assert w.proc is not None and w.proc.poll() is None
