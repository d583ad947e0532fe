"""Signed task messages (``celeriac.serialization.signing``): Celery's ``auth``
serializer with X.509 certificates, end to end through a real worker on Redis, which
refuses an unsigned or tampered message (dead-lettered with the reason, one log line);
compressed signed messages (solo and prefork pools), checked inside their compression;
and the HMAC mode's key rotation. Interop with Celery: ``tests/compat/
test_signing_interop.py``."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celeriac import Celeriac
from celeriac.errors import ConfigurationError, SecurityError
from celeriac.protocol import new_id
from celeriac.serialization import compression, dumps, signing
from celeriac.testing import WorkerProcess, wait_until
from tests.integration import test_signing_app
from tests.integration.support import redis_env

KEY_A = "a" * 32
KEY_B = "b" * 32


@pytest.fixture
def unsign() -> Iterator[None]:
    """``setup_security`` registers ``auth`` for the whole process: undone after."""
    try:
        yield
    finally:
        signing.teardown_security()


def hmac_app(**keys: str) -> Celeriac:
    app = Celeriac("hmac", broker_url="memory://", task_serializer="auth",
                   accept_content=["auth"], security_hmac_keys=keys)
    app.setup_security()
    return app


def test_hmac_rotation_two_keys_verify_the_first_signs(unsign: None) -> None:
    hmac_app(old=KEY_A)
    _, old_body = dumps([[1], {}, {}], "auth")
    rotating = hmac_app(new=KEY_B, old=KEY_A)
    _, new_body = dumps([[2], {}, {}], "auth")
    verifier = signing.current()
    assert verifier is not None
    assert verifier.loads(old_body) == [[1], {}, {}]  # the old key, in the window
    assert verifier.loads(new_body) == [[2], {}, {}]
    assert signing.unpack(new_body).signer == b"hmac:new"
    assert rotating.settings.security_hmac_keys == {"new": KEY_B, "old": KEY_A}
    hmac_app(new=KEY_B)  # the window closed: the old key is dropped everywhere
    verifier = signing.current()
    assert verifier is not None
    with pytest.raises(SecurityError, match="unknown signing key 'hmac:old'"):
        verifier.verify(old_body)
    forged = signing.pack(dataclasses.replace(signing.unpack(new_body), body=b"[[3],{},{}]"))
    with pytest.raises(SecurityError, match="bad signature"):
        verifier.verify(forged)


def test_setup_security_refuses_what_celery_refuses(unsign: None) -> None:
    app = Celeriac("plain", broker_url="memory://", security_hmac_keys={"k": KEY_A})
    with pytest.raises(ConfigurationError, match="task_serializer='auth'"):
        app.setup_security()
    with pytest.raises(ConfigurationError, match="at least 32 bytes"):
        hmac_app(short="x" * 8)
    app = Celeriac("nokeys", broker_url="memory://", task_serializer="auth",
                   accept_content=["auth"])
    with pytest.raises(ConfigurationError, match="security_key"):
        app.setup_security()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("certs")
    test_signing_app.make_certificate(where)
    return where


@pytest.fixture
def fleet(certs: Path, unsign: None, request: pytest.FixtureRequest
          ) -> Iterator[tuple[Celeriac, WorkerProcess]]:
    """A signing worker (its pool ``request.param``, solo unless a test says) and a
    signing producer on a Redis namespace of their own."""
    pool = getattr(request, "param", "solo")
    with redis_env("sg", SIGNING_DIR=certs) as env:
        env["SIGNING_DIR"] = str(certs)
        worker = WorkerProcess("tests.integration.test_signing_app", "-P", pool,
                               *(["-c", "2"] if pool == "prefork" else []),
                               "--without-gossip", "--without-mingle", env=env)
        worker.start(30, wait_ready=False)
        app = Celeriac("signing_app", broker_url=env["CELERIAC_BROKER_URL"],
                       result_backend=env["CELERIAC_RESULT_BACKEND"])
        test_signing_app.configure(app, env)
        try:
            worker.wait_for_log(r" ready: ", 30)
            yield app, worker
        finally:
            worker.kill()
            app.close()


def refused(worker: WorkerProcess, task_id: str) -> list[str]:
    return re.findall(rf"dead-lettered message {task_id} .*", worker.log)


def dead_reasons(app: Celeriac, *task_ids: str) -> dict[str, str]:
    """The dead letters' reasons by task id, once all of ``task_ids`` are among them (the
    worker logs a refusal before its pump's next turn stores the dead letter)."""
    def reasons() -> dict[str, str]:
        return {d.message.headers["id"]: d.reason for d in app.transport.dead_letters()}

    wait_until(lambda: set(task_ids) <= set(reasons()), 20, message="dead letters stored")
    return reasons()


@pytest.mark.slow
def test_a_signed_task_runs_and_unsigned_or_tampered_ones_are_dead_lettered(
        fleet: tuple[Celeriac, WorkerProcess]) -> None:
    app, worker = fleet
    assert app.send_task("signing_app.add", (2, 3)).get(timeout=20) == 5

    unsigned = Celeriac("unsigned", broker_url=app.settings.broker_url,
                        result_backend=app.settings.result_backend)
    try:
        bare = unsigned.send_task("signing_app.add", (1, 1))
    finally:
        unsigned.close()
    message = _signed_message(app)
    signed = signing.unpack(message.body)
    tampered = dataclasses.replace(signed, body=signed.body.replace(b"40", b"99"))
    bad = dataclasses.replace(message, body=signing.pack(tampered))
    app.transport.publish("celery", bad)
    bad_id = bad.headers["id"]

    for task_id in (bare.id, bad_id):
        wait_until(lambda t=task_id: refused(worker, t), 20, message=f"{task_id} refused")
        assert len(refused(worker, task_id)) == 1  # one log line each
    assert "unsigned message" in refused(worker, bare.id)[0]
    assert "signature check failed: bad signature" in refused(worker, bad_id)[0]
    with pytest.raises(Exception, match="unsigned message"):
        bare.get(timeout=10)
    reasons = dead_reasons(app, bare.id, bad_id)
    assert "unsigned message" in reasons[bare.id]
    assert "bad signature" in reasons[bad_id]
    assert "succeeded" not in worker.log.split(bad_id, 1)[1]


@pytest.mark.slow
@pytest.mark.parametrize("fleet", ["solo", "prefork"], indirect=True)
def test_compressed_signed_tasks_run_and_tampered_ones_are_dead_lettered(
        fleet: tuple[Celeriac, WorkerProcess]) -> None:
    """``task_compression`` with the auth serializer: the envelope is compressed after it
    is signed (kombu's order), so the worker checks it inside the compression."""
    app, worker = fleet
    app.conf.task_compression = "gzip"
    results = [app.send_task("signing_app.add", (i, 1)) for i in range(3)]
    results.append(app.send_task("signing_app.add", (5, 5), compression="bzip2"))
    assert [r.get(timeout=20) for r in results] == [1, 2, 3, 10]

    message = _signed_message(app, "gzip")
    kind = message.headers[compression.HEADER]
    signed = signing.unpack(compression.decompress(message.body, kind, 1 << 20))
    tampered = signing.pack(dataclasses.replace(signed, body=signed.body.replace(b"40", b"99")))
    bad = dataclasses.replace(message, body=compression.compress(tampered, kind)[1])
    corrupt = dataclasses.replace(_signed_message(app, "gzip"), body=b"\x00not zlib")
    for each in (bad, corrupt):
        app.transport.publish("celery", each)
    bad_id, corrupt_id = bad.headers["id"], corrupt.headers["id"]
    for task_id in (bad_id, corrupt_id):
        wait_until(lambda t=task_id: refused(worker, t), 20, message=f"{task_id} refused")
        assert len(refused(worker, task_id)) == 1
    assert "signature check failed: bad signature" in refused(worker, bad_id)[0]
    assert "cannot decompress its signed body: corrupt" in refused(worker, corrupt_id)[0]
    reasons = dead_reasons(app, bad_id, corrupt_id)
    assert "bad signature" in reasons[bad_id]
    assert "corrupt application/x-gzip data" in reasons[corrupt_id]
    with pytest.raises(SecurityError, match="bad signature"):
        app.AsyncResult(bad_id).get(timeout=10)
    assert "succeeded" not in worker.log.split(bad_id, 1)[1]


def _signed_message(app: Celeriac, packed: str | None = None) -> Any:
    """A message ``send_task`` would publish for ``add(40, 2)`` (compressed with
    ``packed``), unpublished."""
    from celeriac.producer import SendOptions, builder

    options = SendOptions.from_mapping("send_task", {"task_id": new_id(),
                                                     "compression": packed})
    message, _, _ = builder.build(app, "signing_app.add", (40, 2), None, options)
    return message
