"""The app the signing tests' workers run (``test_signing.py``), and
``make_certificate``, which those tests and ``tests/compat/test_signing_interop.py`` use
to make an RSA key and a self-signed certificate as Celery's docs ask for.

The worker reads where the key, certificate and store are from the environment
(``SIGNING_DIR``), or its HMAC keys (``SIGNING_HMAC``: ``id=secret,id=secret``)."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

from celeriac import Celeriac, Settings


def make_certificate(directory: Path, name: str = "worker") -> tuple[Path, Path]:
    """``<name>.key`` and ``<name>.pem`` in ``directory``: a 2048-bit RSA key and its
    self-signed certificate, valid for a day."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"celeriac-test-{name}"),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "celeriac")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    key_path, cert_path = directory / f"{name}.key", directory / f"{name}.pem"
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.TraditionalOpenSSL,
                                           serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key_path, cert_path


def configure(app: Celeriac, environ: dict[str, str] | os._Environ[str]) -> None:
    """Signing as the environment says (see the module's docstring)."""
    if "SIGNING_HMAC" in environ:
        keys = dict(pair.split("=", 1) for pair in environ["SIGNING_HMAC"].split(","))
        app.conf.update(task_serializer="auth", accept_content=["auth"],
                        security_hmac_keys=keys)
    else:
        where = Path(environ["SIGNING_DIR"])
        app.conf.update(task_serializer="auth", accept_content=["auth"],
                        security_key=str(where / "worker.key"),
                        security_certificate=str(where / "worker.pem"),
                        security_cert_store=str(where / "*.pem"))
    app.setup_security()


app = Celeriac("signing_app", settings=Settings.from_env())
if "SIGNING_DIR" in os.environ or "SIGNING_HMAC" in os.environ:
    configure(app, os.environ)


@app.task(name="signing_app.add")
def add(x: int, y: int) -> int:
    return x + y
