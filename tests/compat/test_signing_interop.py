"""Signed task messages between Celery and celeriac, both ways: Celery's ``auth``
serializer (X.509, RSA-PSS) on one Redis, kombu's layout, with a certificate made for the
test. A real Celery 5 worker and client (``tests/.venv-celery``, which gets
``cryptography`` if it lacks it) beside a real celeriac worker, each signing with its
own key and trusting both certificates, uncompressed and gzip-compressed; a celeriac
worker refuses Celery's unsigned message. Redis database 14, queues named per run."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celeriac import Celeriac
from celeriac.serialization import signing
from celeriac.testing import WorkerProcess, wait_until
from tests.compat.conftest import ROOT, CeleryClient
from tests.integration.test_signing_app import make_certificate
from tests.services import require

pytestmark = pytest.mark.slow

DB = 14
PLAIN = f"redis://127.0.0.1:6379/{DB}"
RUN = uuid.uuid4().hex[:8]
TO_CELERY, TO_CELERIAC = f"sig-celery-{RUN}", f"sig-celeriac-{RUN}"

CELERY_APP = """
import os
from celery import Celery

app = Celery("compat", broker=os.environ["COMPAT_BROKER"], backend=os.environ["COMPAT_BACKEND"])
app.conf.update(
    task_serializer="auth", accept_content=["auth"], result_accept_content=["json"],
    security_key=os.environ["SIGN_KEY"], security_certificate=os.environ["SIGN_CERT"],
    security_cert_store=os.environ["SIGN_STORE"], broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False)
app.setup_security()


@app.task(name="compat.who")
def who(*args):
    return ["celery", *args]
"""

CELERIAC_APP = """
import os
from celeriac import Celeriac

app = Celeriac("compat", broker=os.environ["COMPAT_BROKER"] + "?layout=kombu",
               backend=os.environ["COMPAT_BACKEND"] + "?layout=celery",
               task_serializer="auth", accept_content=["auth"],
               security_key=os.environ["SIGN_KEY"],
               security_certificate=os.environ["SIGN_CERT"],
               security_cert_store=os.environ["SIGN_STORE"])
app.setup_security()


@app.task(name="compat.who")
def who(*args):
    return ["celeriac", *args]
"""


def _with_cryptography(venv: Path) -> None:
    python = str(venv / "bin" / "python")
    if subprocess.run([python, "-c", "import cryptography"], capture_output=True).returncode:
        subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "cryptography"], check=True, capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def where(celery_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    require("redis")
    _with_cryptography(celery_venv)
    where = tmp_path_factory.mktemp("signing")
    (where / "certs").mkdir()
    make_certificate(where / "certs", "celery")
    make_certificate(where / "certs", "celeriac")
    (where / "signed_celery.py").write_text(textwrap.dedent(CELERY_APP))
    (where / "signed_celeriac.py").write_text(textwrap.dedent(CELERIAC_APP))
    return where


def env_for(where: Path, side: str) -> dict[str, str]:
    return {"COMPAT_BROKER": PLAIN, "COMPAT_BACKEND": PLAIN,
            "SIGN_KEY": str(where / "certs" / f"{side}.key"),
            "SIGN_CERT": str(where / "certs" / f"{side}.pem"),
            "SIGN_STORE": str(where / "certs" / "*.pem")}


@pytest.fixture(scope="module")
def fleet(where: Path, celery_venv: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path,
                                                            WorkerProcess]]:
    log = where / "celery.log"
    with open(log, "wb") as out:
        celery = subprocess.Popen(
            [str(celery_venv / "bin" / "celery"), "-A", "signed_celery", "worker", "-P",
             "solo", "-n", f"celery-sig-{RUN}@%h", "-Q", TO_CELERY, "-l", "info",
             "--without-gossip", "--without-mingle"],
            cwd=where, env={**os.environ, **env_for(where, "celery")}, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True)
    ours = WorkerProcess("signed_celeriac", "-P", "solo", "-n", f"celeriac-sig-{RUN}@%h", "-Q",
                         TO_CELERIAC, env={**env_for(where, "celeriac"),
                                           "PYTHONPATH": f"{where}:{ROOT}"},
                         cwd=str(where))
    try:
        ours.start(60)
        wait_until(lambda: b" ready." in log.read_bytes() or celery.poll() is not None, 60,
                   message="celery worker ready")
        assert celery.poll() is None, log.read_text(errors="replace")
        yield celery, log, ours
    finally:
        ours.kill()
        if celery.poll() is None:
            os.killpg(celery.pid, signal.SIGTERM)
            try:
                celery.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(celery.pid, signal.SIGKILL)
                celery.wait(5)


@pytest.fixture(scope="module")
def client(where: Path, celery_venv: Path) -> Iterator[CeleryClient]:
    """Celery's client, signing with Celery's key (``celery_driver.py``'s app, set up for
    signing by the first call)."""
    c = CeleryClient(celery_venv, {**env_for(where, "celery"), "COMPAT_BROKER": PLAIN,
                                   "COMPAT_BACKEND": PLAIN})
    try:
        yield c
    finally:
        c.close()


PACKED = pytest.mark.parametrize("packed", [None, "gzip"])
"""Uncompressed, and compressed as ``task_compression="gzip"`` does: kombu compresses the
signed envelope, and a worker checks the signature inside the compression."""


@PACKED
def test_celery_signs_celeriac_verifies_and_runs(fleet: Any, client: CeleryClient,
                                                 packed: str | None) -> None:
    options = f", compression={packed!r}" if packed else ""
    out = client.run(textwrap.dedent(f"""
        import os
        app.conf.update(task_serializer="auth", accept_content=["auth"],
                        result_accept_content=["json"], security_key=os.environ["SIGN_KEY"],
                        security_certificate=os.environ["SIGN_CERT"],
                        security_cert_store=os.environ["SIGN_STORE"])
        app.setup_security()
        r = proj.who.apply_async((1,), queue={TO_CELERIAC!r}{options})
        out = [r.get(timeout=30), r.id]
    """))
    assert out[0] == ["celeriac", 1]
    _, _, ours = fleet
    # The log is read from the worker's output as it comes: it may trail the result.
    ours.wait_for_log(rf"\[{out[1]}\] succeeded", 20)


@PACKED
def test_celeriac_signs_celery_verifies_and_runs(fleet: Any, where: Path,
                                                 packed: str | None) -> None:
    env = env_for(where, "celeriac")
    app = Celeriac("signer", broker=f"{PLAIN}?layout=kombu", backend=f"{PLAIN}?layout=celery",
                   task_serializer="auth", accept_content=["auth"], task_compression=packed,
                   security_key=env["SIGN_KEY"], security_certificate=env["SIGN_CERT"],
                   security_cert_store=env["SIGN_STORE"])
    try:
        app.setup_security()
        result = app.send_task("compat.who", (2,), queue=TO_CELERY)
        assert result.get(timeout=30) == ["celery", 2]
    finally:
        app.close()
        signing.teardown_security()


def test_celeriac_refuses_celerys_unsigned_message(fleet: Any, client: CeleryClient) -> None:
    out = client.run(textwrap.dedent(f"""
        r = app.send_task("compat.who", (3,), queue={TO_CELERIAC!r}, serializer="json")
        out = r.id
    """))
    _, _, ours = fleet
    ours.wait_for_log(rf"dead-lettered message {out} .*unsigned message", 30)
