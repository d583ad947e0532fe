"""Celery itself, for the compatibility tests: a Celery 5 virtualenv made with the bench's
machinery (``bench/run.py``'s ``PeerVenv``) at ``tests/.venv-celery`` on first use,
Celery workers and a Celery client (``celery_driver.py``) running in it, and celeriac
workers beside them.

Without the virtualenv (no network to PyPI, say) the tests skip on a user's machine and
fail under ``CI=true``, as ``tests/services.py`` does for a missing service.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from celeriac.testing import WorkerProcess, wait_until
from tests.services import IN_CI

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
REQUIREMENTS = ("celery[redis,sqlalchemy,sqs]>=5.3,<6", "flower", "psycopg[binary]",
                "cryptography", "PyMySQL")


def _venv() -> Any:
    sys.path.insert(0, str(ROOT / "bench"))  # bench's modules import their siblings
    from harness import Peer
    from peer_systems import PeerVenv

    peer = Peer(key="celery-compat", label="Celery", name="celery compat",
                requirements=REQUIREMENTS, driver="", worker=(), redis_db=0,
                bulk_methods={}, detail="")
    venv = PeerVenv(peer)
    venv.path = ROOT / "tests" / ".venv-celery"
    venv.stamp = venv.path / ".bench-installed"
    venv.python = venv.path / "bin" / "python"
    venv.log = venv.path.with_name(venv.path.name + ".log")
    return venv


@pytest.fixture(scope="session")
def celery_venv() -> Path:
    """The Celery virtualenv's directory (made once; reused while its requirements hold)."""
    venv = _venv()
    try:
        venv.ensure(timeout=600)
    except Exception as exc:
        message = f"cannot make the Celery virtualenv at {venv.path}: {exc}"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return Path(venv.path)


class CeleryWorker:
    """``celery -A celery_proj worker`` in the Celery virtualenv."""

    def __init__(self, venv: Path, env: Mapping[str, str], name: str, queues: str,
                 concurrency: int = 1) -> None:
        self.log_path = Path(f"/tmp/celeriac-compat-{name}-{os.getpid()}.log")
        self.log_file = open(self.log_path, "wb")  # noqa: SIM115  (closed in stop)
        self.proc = subprocess.Popen(
            [str(venv / "bin" / "celery"), "-A", "celery_proj", "worker", "-P", "prefork",
             "-c", str(concurrency), "-n", f"{name}@%h", "-Q", queues, "-l", "info",
             "--without-gossip", "--without-mingle"],
            cwd=HERE, env={**os.environ, **env}, stdout=self.log_file,
            stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_until(lambda: b" ready." in self.log_path.read_bytes() or self._died(), 60,
                       message="celery worker ready")
            if self.proc.poll() is not None:
                raise RuntimeError(f"celery worker exited:\n{self.log}")
        except BaseException:
            self.stop()  # no caller holds it to stop it: not its process, not its log
            raise

    def _died(self) -> bool:
        return self.proc.poll() is not None

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.log_file.close()


class CeleryClient:
    """A Celery producer and result reader: ``celery_driver.py`` over a pipe."""

    def __init__(self, venv: Path, env: Mapping[str, str]) -> None:
        self.proc = subprocess.Popen(
            [str(venv / "bin" / "python"), "-u", "celery_driver.py"], cwd=HERE,
            env={**os.environ, **env}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, start_new_session=True)
        self._lock = threading.Lock()
        self._read(60)

    def _read(self, timeout: float) -> Any:
        assert self.proc.stdout is not None
        result: list[bytes] = []
        stdout = self.proc.stdout
        reader = threading.Thread(target=lambda: result.append(stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(timeout)
        if not result or not result[0]:
            raise RuntimeError("the Celery driver did not answer")
        answer = json.loads(result[0])
        if not answer["ok"]:
            raise CeleryError(answer["error"], answer.get("traceback", ""))
        return answer["out"]

    def run(self, code: str, timeout: float = 60) -> Any:
        """Run ``code`` in the Celery client; returns what it put in ``out``."""
        assert self.proc.stdin is not None
        with self._lock:
            self.proc.stdin.write(json.dumps({"code": code}).encode() + b"\n")
            self.proc.stdin.flush()
            return self._read(timeout)

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.proc.stdout.close()


class CeleryError(Exception):
    """An exception raised in the Celery client (its type and message)."""


def celeriac_worker(env: Mapping[str, str], name: str, queues: str,
                    *args: str) -> WorkerProcess:
    return WorkerProcess("celeriac_proj", "-n", f"{name}@%h", "-Q", queues, *args,
                         env={**env, "PYTHONPATH": f"{HERE}:{ROOT}"}, cwd=str(HERE)).start(30)


@pytest.fixture(scope="module")
def fleet_factory(celery_venv: Path) -> Iterator[Any]:
    """Starts workers and clients for a module; stops them all at its end."""
    started: list[Any] = []

    class Factory:
        venv = celery_venv

        def celery_worker(self, env: Mapping[str, str], name: str, queues: str,
                          concurrency: int = 1) -> CeleryWorker:
            worker = CeleryWorker(celery_venv, env, name, queues, concurrency)
            started.append(worker)
            return worker

        def celeriac_worker(self, env: Mapping[str, str], name: str, queues: str,
                            *args: str) -> WorkerProcess:
            worker = celeriac_worker(env, name, queues, *args)
            started.append(worker)
            return worker

        def client(self, env: Mapping[str, str]) -> CeleryClient:
            client = CeleryClient(celery_venv, env)
            started.append(client)
            return client

        def redis_pair(self, url: str, **extra: str) -> Any:
            """On the Redis at ``url`` (``extra``: more ``COMPAT_*`` settings for both
            sides): a Celery worker on ``to_celery,mixed``, a celeriac worker in
            compatibility mode on ``to_celeriac,mixed``, and ``self.celery``, a client."""
            theirs = {"COMPAT_BROKER": url, "COMPAT_BACKEND": url, **extra}
            ours = {**theirs, "COMPAT_BROKER": f"{url}?layout=kombu",
                    "COMPAT_BACKEND": f"{url}?layout=celery"}
            self.celery_worker(theirs, "celery1", "to_celery,mixed", concurrency=2)
            self.celeriac_worker(ours, "celeriac1", "to_celeriac,mixed", "-c", "2")
            self.celery = self.client(theirs)
            return self

    yield Factory()
    errors: list[BaseException] = []
    for thing in reversed(started):  # every one stopped, even after one fails to
        try:
            if isinstance(thing, CeleryClient):
                thing.close()
            else:
                thing.stop()
        except Exception as exc:
            errors.append(exc)
    if errors:
        raise errors[0]


def settle(predicate: Any, timeout: float = 20.0, message: str = "condition") -> Any:
    """``predicate()`` once it is true, or its last value after ``timeout`` (the caller
    asserts on it)."""
    try:
        return wait_until(predicate, timeout, 0.05, message)
    except TimeoutError:
        return predicate()


def counted_chords(app: Any, count: int, size: int, key: str) -> tuple[list[Any], str]:
    """``count`` chords of ``size`` ``compat.add(n, i)`` header tasks, alternately on each
    fleet's queue, each with a ``compat.count_total`` body on ``mixed`` that counts its runs
    under ``<key>:ours:<n>``: the chords sent from here, and the Celery client's code that
    sends the same (counted under ``<key>:theirs:<n>``) and puts their results in ``out``."""
    from celeriac import chord, group, signature

    sent = []
    for n in range(count):
        header = group(signature("compat.add", (n, i), app=app).set(
            queue="to_celery" if i % 2 else "to_celeriac") for i in range(size))
        body = signature("compat.count_total", kwargs={"key": f"{key}:ours:{n}"}, app=app)
        sent.append(chord(header)(body.set(queue="mixed")))
    code = (f"rs = [chord(group(proj.add.s(n, i).set(queue='to_celery' if i % 2 "
            f"else 'to_celeriac') for i in range({size})))(proj.count_total.s("
            f"key=f'{key}:theirs:{{n}}').set(queue='mixed')) for n in range({count})]\n"
            "out = [r.get(timeout=60) for r in rs]")
    return sent, code
