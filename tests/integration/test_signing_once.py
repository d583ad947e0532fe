"""A signed task message's signature is checked once per message: where it enters the
worker's main process (``Admission``), not again where the task runs (the pool opens
the admitted body: ``signing.open_admitted``). Counted in one process, through a real
worker (solo and threads pools: they run the same decode as a prefork child), also when
compressed; a compressed body checked inside its compression where it enters. Unsigned
and tampered messages are still refused where they enter: ``test_signing.py``; across
Celery: ``tests/compat/test_signing_interop.py``."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator

import pytest

from celeriac import Celeriac
from celeriac.errors import DecodeError, SecurityError
from celeriac.protocol import Message
from celeriac.serialization import compression, dumps, signing
from celeriac.testing import ThreadedWorker
from celeriac.worker.admission import Admission


@pytest.fixture
def app() -> Iterator[Celeriac]:
    url = f"memory://{uuid.uuid4().hex}"
    app = Celeriac("signed-once", broker=url, backend=url, task_serializer="auth",
                   accept_content=["auth"], security_hmac_keys={"k": "k" * 32})
    app.setup_security()
    try:
        yield app
    finally:
        app.close()
        signing.teardown_security()  # setup_security registers auth process-wide


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The bodies ``SecureSerializer.verify`` checks, as it checks them (a spy on the
    real verifier)."""
    seen: list[bytes] = []
    real = signing.SecureSerializer.verify

    def counting(self: signing.SecureSerializer, data: bytes) -> signing.Signed:
        seen.append(data)
        return real(self, data)

    monkeypatch.setattr(signing.SecureSerializer, "verify", counting)
    return seen


@pytest.mark.parametrize(("pool", "packed"), [("solo", None), ("threads", None),
                                               ("solo", "gzip"), ("threads", "bzip2")])
def test_each_signed_message_is_verified_once(app: Celeriac, checks: list[bytes],
                                              pool: str, packed: str | None) -> None:
    """Compressed too (``task_compression``): checked once, where it enters, over the
    signed envelope the compressed body holds."""
    app.conf.task_compression = packed

    @app.task(name="signed.add")
    def add(x: int, y: int) -> int:
        return x + y

    with ThreadedWorker(app, pool=pool, concurrency=2):
        results = [add.delay(i, i) for i in range(4)]
        assert [r.get(timeout=10) for r in results] == [0, 2, 4, 6]
        chained = (add.s(1, 1) | add.s(10)).delay()  # a follow-up is signed and checked too
        assert chained.get(timeout=10) == 12
    assert len(checks) == 6
    assert len(set(checks)) == 6  # one check per message, none twice
    assert all(signing.unpack(data) for data in checks)  # envelopes, not compressed bytes


def test_the_admitted_body_opens_unchecked_and_a_bad_one_is_a_decode_error(
        app: Celeriac) -> None:
    _, body = dumps([[1, 2], {}, {}], "auth")
    assert signing.open_admitted(body) == [[1, 2], {}, {}]
    verifier = signing.current()
    assert verifier is not None
    tampered = signing.pack(dataclasses.replace(signing.unpack(body), body=b"[[9],{},{}]"))
    with pytest.raises(SecurityError, match="bad signature"):  # checked where it is read
        verifier.loads(tampered)
    for bad in (b"not base64!", signing.pack(dataclasses.replace(
            signing.unpack(body), content_type="application/nonesuch"))):
        with pytest.raises(DecodeError):
            signing.open_admitted(bad)
    assert signing.checked_at_entry(app.settings.accept_content)
    assert not signing.checked_at_entry(("json",))


def _compressed(app: Celeriac, packed: str) -> Message:
    """The message ``send_task`` would publish for ``signed.add(40, 2)``, compressed with
    ``packed``, unpublished."""
    from celeriac.producer import SendOptions, builder

    options = SendOptions.from_mapping("send_task", {"compression": packed})
    message, _, _ = builder.build(app, "signed.add", (40, 2), None, options)
    return message


def _repacked(message: Message, body: bytes) -> Message:
    return dataclasses.replace(
        message, body=compression.compress(body, message.headers[compression.HEADER])[1])


@pytest.mark.parametrize("packed", ["gzip", "lzma"])
def test_a_compressed_body_is_verified_inside_its_compression(app: Celeriac,
                                                              packed: str) -> None:
    """Where it enters, the signature is checked over the decompressed envelope (kombu
    compresses what the auth serializer signed); a tampered, corrupt or too large inside
    is refused there, with the reason."""
    app.conf.max_message_size = 4096
    app.task(name="signed.add")(lambda x, y: x + y)
    admission = Admission(app)
    message = _compressed(app, packed)
    assert message.content_type == signing.CONTENT_TYPE
    assert admission.check(message) is None
    kind = message.headers[compression.HEADER]
    signed = signing.unpack(compression.decompress(message.body, kind, 4096))

    forged = signing.pack(dataclasses.replace(signed, body=signed.body.replace(b"40", b"99")))
    refusal = admission.check(_repacked(message, forged))
    assert refusal is not None and isinstance(refusal.error, SecurityError)
    assert refusal.reason.startswith("signature check failed: bad signature")
    refusal = admission.check(_repacked(message, b"[[40, 2], {}, {}]"))  # compressed, unsigned
    assert refusal is not None and "not a signed message body" in refusal.reason

    for body, why in ((b"\x00not compressed", "corrupt"),
                      (compression.compress(b"0" * 5000, kind)[1], "expands past 4096")):
        refusal = admission.check(dataclasses.replace(message, body=body))
        assert refusal is not None and isinstance(refusal.error, DecodeError)
        assert refusal.reason.startswith("malformed message: cannot decompress its signed")
        assert why in refusal.reason
