"""Signed task messages: Celery's ``auth`` serializer, and an HMAC mode with key rotation.

**The wire** is Celery's (``celery/security/serialization.py``), so signed messages pass
between Celery and celeriac both ways. The body is encoded by the inner serializer
(JSON), signed, and sent as::

    base64( base64(signer) SEP base64(signature) SEP content_type SEP encoding SEP body )

with ``SEP = b"\\x00\\x01"``, content type ``application/data``, encoding ``utf-8``. What
is signed is the encoded body, so a worker checks it before decoding a byte of it. The
headers are not signed (Celery's choice); the body holds the arguments.

**X.509** (Celery's): RSA-PSS (MGF1, maximal salt) over ``security_digest``; ``signer``
is the certificate's issuer (its attribute values joined by spaces) and serial number,
looked up in the worker's ``security_cert_store`` (expired certificates refused).

**HMAC** (celeriac's own, ``security_hmac_keys``): ``signer`` is ``hmac:<key id>`` and
the signature an HMAC of the body with that key. The first key signs; every key listed
verifies, so two keys are valid through a rotation. Celery cannot read these.

``setup_security`` registers the serializer as ``auth`` in this process (as Celery's
does in kombu's registry); the worker's admission checks each signed message with
``current().verify`` and refuses what fails (``worker/admission.py``).

**Checked once.** A worker checks a task message's signature once, where it enters the
main process (``checked_at_entry`` says when: the same for both, from the settings).
What runs the task (a pool child, the solo or threads pool) opens the body with
``open_admitted``, which does not check it again: a job reaches it only from the main
process, which admitted its message (over the pool's pipe, trusted; the broker is not).
Everywhere else (a result read, ``SecureSerializer.loads``) a signed body is checked.

**Compressed.** With ``task_compression`` the signed envelope is compressed after it is
signed (kombu's order: serialize, then compress; the ``compression`` header names it), so
the entry check decompresses the body first (within ``max_message_size``) and verifies
the envelope inside. What runs the task decompresses the same bytes again and opens them
unchecked: decompression depends on the bytes and the header alone, so it gets the very
envelope that was verified.
"""

from __future__ import annotations

import base64
import glob
import hashlib
import hmac
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigurationError, DecodeError, SecurityError
from . import AUTH_UNSET, RAW, SERIALIZERS, Serializer, get_serializer, register

CONTENT_TYPE = "application/data"
SEPARATOR = b"\x00\x01"
HMAC_PREFIX = b"hmac:"
MIN_HMAC_KEY = 32
"""Bytes an HMAC key must have at least."""


@dataclass(frozen=True, slots=True)
class Signed:
    """One unpacked signed body."""

    signer: bytes
    signature: bytes
    content_type: str
    encoding: str
    body: bytes


def pack(signed: Signed) -> bytes:
    fields = SEPARATOR.join([base64.b64encode(signed.signer), base64.b64encode(signed.signature),
                             signed.content_type.encode(), signed.encoding.encode(),
                             signed.body])
    return base64.b64encode(fields)


def unpack(data: bytes) -> Signed:
    """``data`` as Celery's ``SecureSerializer._unpack`` reads it; ``SecurityError`` if it
    is not a signed body."""
    try:
        raw = base64.b64decode(data, validate=True)
        signer, signature, content_type, encoding, body = raw.split(SEPARATOR, 4)
        return Signed(base64.b64decode(signer), base64.b64decode(signature),
                      content_type.decode(), encoding.decode(), body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SecurityError(f"not a signed message body: {exc}") from None


def _hash(digest: str) -> Any:
    from cryptography.hazmat.primitives import hashes  # deferred: optional dependency

    algorithm = getattr(hashes, digest.upper(), None)
    if algorithm is None:
        raise ConfigurationError(f"security_digest: unknown digest {digest!r}")
    return algorithm()


def _pss(digest: Any) -> Any:
    from cryptography.hazmat.primitives.asymmetric import padding

    return padding.PSS(mgf=padding.MGF1(digest), salt_length=padding.PSS.MAX_LENGTH)


def certificate_id(cert: Any) -> str:
    """Celery's ``Certificate.get_id``: the issuer's attribute values and the serial."""
    issuer = " ".join(str(attribute.value) for attribute in cert.issuer)
    return f"{issuer} {cert.serial_number}"


def load_certificate(pem: bytes, where: str) -> Any:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import rsa

    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError as exc:
        raise ConfigurationError(f"{where}: not a PEM certificate ({exc})") from None
    if not isinstance(cert.public_key(), rsa.RSAPublicKey):
        raise ConfigurationError(f"{where}: only RSA certificates are supported (as Celery)")
    return cert


def load_store(path: str) -> dict[str, Any]:
    """``security_cert_store``: a directory (every file in it) or a glob of PEM
    certificates -> their public keys by certificate id. Expired ones are refused."""
    import datetime

    pattern = os.path.join(path, "*") if os.path.isdir(path) else path
    store: dict[str, Any] = {}
    for name in sorted(glob.glob(pattern)):
        with open(name, "rb") as f:
            cert = load_certificate(f.read(), f"security_cert_store {name}")
        if datetime.datetime.now(datetime.UTC) >= cert.not_valid_after_utc:
            raise ConfigurationError(f"security_cert_store: certificate {name} has expired")
        store[certificate_id(cert)] = cert.public_key()
    if not store:
        raise ConfigurationError(f"security_cert_store: no certificate in {path!r}")
    return store


def hmac_keys(value: Any) -> list[tuple[bytes, bytes]]:
    """``security_hmac_keys`` as ``[(key id, secret)]``, the signing key first."""
    if not isinstance(value, Mapping) or not value:
        raise ConfigurationError("security_hmac_keys: expected a mapping of key id -> "
                                 f"secret, got {type(value).__name__}")
    out = []
    for key_id, secret in value.items():
        if not isinstance(key_id, str) or not key_id or not key_id.isprintable():
            raise ConfigurationError(f"security_hmac_keys: bad key id {key_id!r}")
        raw = secret.encode() if isinstance(secret, str) else secret
        if not isinstance(raw, bytes) or len(raw) < MIN_HMAC_KEY:
            raise ConfigurationError(f"security_hmac_keys[{key_id!r}]: a secret of at least "
                                     f"{MIN_HMAC_KEY} bytes is needed")
        out.append((key_id.encode(), raw))
    return out


class SecureSerializer:
    """Signs what it encodes, and verifies before it decodes."""

    def __init__(self, *, digest: str = "sha256", inner: str = "json",
                 key: Any = None, cert_id: str | None = None,
                 store: Mapping[str, Any] | None = None,
                 hmac_keys: list[tuple[bytes, bytes]] | None = None) -> None:
        self.digest = digest.lower()
        self.inner = get_serializer(inner)
        self._key, self._cert_id = key, cert_id
        self._store = dict(store or {})
        self._hmac = list(hmac_keys or [])
        self._hmac_by_id = dict(self._hmac)
        if self._hmac and digest.lower() not in hashlib.algorithms_available:
            raise ConfigurationError(f"security_digest: {digest!r} is not a hashlib digest")
        self._rsa_digest = _hash(digest) if key is not None or self._store else None

    def sign(self, body: bytes) -> tuple[bytes, bytes]:
        """``(signer, signature)`` of ``body``."""
        if self._hmac:
            key_id, secret = self._hmac[0]
            return HMAC_PREFIX + key_id, hmac.new(secret, body, self.digest).digest()
        if self._key is None or self._cert_id is None:
            raise ConfigurationError("the auth serializer cannot sign: security_key and "
                                     "security_certificate are not set")
        signature = self._key.sign(body, _pss(self._rsa_digest), self._rsa_digest)
        return self._cert_id.encode(), signature

    def dumps(self, obj: Any) -> bytes:
        body = self.inner.dumps(obj)
        signer, signature = self.sign(body)
        return pack(Signed(signer, signature, self.inner.content_type, "utf-8", body))

    def verify(self, data: bytes) -> Signed:
        """The signed body of ``data``; ``SecurityError`` saying why it is refused."""
        signed = unpack(data)
        who = signed.signer.decode(errors="replace")
        if signed.signer.startswith(HMAC_PREFIX):
            secret = self._hmac_by_id.get(signed.signer[len(HMAC_PREFIX):])
            if secret is None:
                raise SecurityError(f"unknown signing key {who!r}")
            expected = hmac.new(secret, signed.body, self.digest).digest()
            if not hmac.compare_digest(expected, signed.signature):
                raise SecurityError("bad signature: the body does not match its HMAC")
            return signed
        public = self._store.get(who)
        if public is None:
            raise SecurityError(f"unknown certificate {who!r}")
        from cryptography.exceptions import InvalidSignature

        try:
            public.verify(signed.signature, signed.body, _pss(self._rsa_digest),
                          self._rsa_digest)
        except InvalidSignature:
            raise SecurityError("bad signature: the body does not match it") from None
        return signed

    def loads(self, data: bytes) -> Any:
        signed = self.verify(data)
        inner = _by_content_type(signed.content_type)
        return inner(signed.body)

    def serializer(self) -> Serializer:
        return Serializer("auth", CONTENT_TYPE, self.dumps, self.loads)


def _by_content_type(content_type: str) -> Callable[[bytes], Any]:
    for s in SERIALIZERS.values():
        if s.content_type == content_type and s.name != "auth":
            return s.loads
    raise SecurityError(f"signed body of unknown content type {content_type!r}")


def checked_at_entry(accept_content: Sequence[str]) -> bool:
    """Whether a worker with these settings takes signed task messages (``"auth"`` in
    ``accept_content``), checking each signature where the message enters its main
    process (``Admission``): then the process running the task opens the body with
    ``open_admitted``."""
    return "auth" in accept_content


def open_admitted(data: bytes) -> Any:
    """The payload of a signed task body the worker's main process verified where it
    entered (``checked_at_entry``), decoded without checking the signature again: the
    body came over the pool's pipe (or the solo and threads pools' queue), never from the
    broker directly. ``DecodeError`` if it cannot be read."""
    try:
        signed = unpack(data)
        return _by_content_type(signed.content_type)(signed.body)
    except DecodeError:
        raise
    except Exception as exc:
        raise DecodeError(f"cannot decode {CONTENT_TYPE} body: {exc}") from exc


_current: SecureSerializer | None = None


def current() -> SecureSerializer | None:
    """The ``auth`` serializer ``setup_security`` registered in this process, if any."""
    return _current


def setup_security(*, task_serializer: str, accept_content: tuple[str, ...],
                   key: str | None, key_password: str | None, cert: str | None,
                   store: str | None, digest: str, hmac_secrets: Any = None,
                   serializer: str = "json") -> SecureSerializer:
    """Celery's ``setup_security``: check the settings, read the key, certificate and
    store files (or take ``hmac_secrets``, ``security_hmac_keys``), and register the
    ``auth`` serializer."""
    if task_serializer != "auth" or tuple(accept_content) != ("auth",):
        raise ConfigurationError(
            "message signing needs task_serializer='auth' and accept_content=['auth'] "
            "(there is no point signing messages that are not verified)")
    try:
        import cryptography  # noqa: F401
    except ImportError:
        raise ConfigurationError("message signing needs the cryptography package: pip "
                                 "install 'celeriac[auth]'") from None
    if hmac_secrets is not None:
        s = SecureSerializer(digest=digest, inner=serializer,
                             hmac_keys=hmac_keys(hmac_secrets),
                             store=load_store(store) if store else None)
    else:
        if not (key and cert and store):
            raise ConfigurationError("message signing needs security_key, "
                                     "security_certificate and security_cert_store (or "
                                     "security_hmac_keys)")
        s = SecureSerializer(digest=digest, inner=serializer, key=_load_key(key, key_password),
                             cert_id=certificate_id(_load_file_cert(cert)),
                             store=load_store(store))
    global _current
    _current = s
    register(s.serializer())
    return s


def teardown_security() -> None:
    """Undo ``setup_security`` in this process (tests; an app that stops signing)."""
    global _current
    _current = None
    register(AUTH_UNSET)
    register(RAW)  # application/data bodies are raw bytes again
    SERIALIZERS.pop(RAW.name, None)


def _load_key(path: str, password: str | None) -> Any:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    with open(path, "rb") as f:
        pem = f.read()
    try:
        key = serialization.load_pem_private_key(pem, password.encode() if password else None)
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(f"security_key {path}: cannot load it ({exc})") from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise ConfigurationError(f"security_key {path}: only RSA keys are supported (as Celery)")
    return key


def _load_file_cert(path: str) -> Any:
    with open(path, "rb") as f:
        return load_certificate(f.read(), f"security_certificate {path}")
