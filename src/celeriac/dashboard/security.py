"""HTTP basic auth, the Host check, and the headers every response carries.

The dashboard shows task arguments, results and tracebacks, which may hold anything; so:

- with ``auth``, every request (page, API, stream, metrics) needs the credentials; they
  are compared in constant time and the password is never logged or echoed; the user
  name goes on in the ASGI scope as ``celeriac.user`` (the actions log it and bind their
  CSRF tokens to it);
- with ``allowed_hosts`` (the CLI sets the loopback names when it binds to loopback
  without auth), a request whose ``Host`` is anything else gets 421: a web page on
  another site cannot read the dashboard by rebinding its DNS name to 127.0.0.1;
- every response forbids framing and sniffing; the page's CSP allows only our own
  script, style and connections.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
from collections.abc import Iterable
from typing import Any

logger = logging.getLogger("celeriac.dashboard.security")

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"content-security-policy", CSP.encode()),
]


def parse_basic_auth(value: str) -> tuple[str, str]:
    """``user:password`` -> (user, password); ValueError without echoing the value."""
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise ValueError("expected USER:PASSWORD, both non-empty")
    return user, password


def host_of(header: str) -> str:
    """The host part of a Host header: ``[::1]:5555`` -> ``::1``, ``a:80`` -> ``a``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class SecurityMiddleware:
    """ASGI middleware: Host check, basic auth, security headers."""

    def __init__(self, app: Any, *, auth: tuple[str, str] | None = None,
                 allowed_hosts: Iterable[str] | None = None, realm: str = "celeriac") -> None:
        self.app = app
        self._user = auth[0].encode() if auth else None
        self._password = auth[1].encode() if auth else None
        self.allowed_hosts = ({h.lower().strip("[]") for h in allowed_hosts}
                              if allowed_hosts is not None else None)
        self._challenge = f'Basic realm="{realm}", charset="UTF-8"'.encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        if self.allowed_hosts is not None:
            host = host_of(headers.get(b"host", b"").decode("latin-1"))
            if host not in self.allowed_hosts:
                await _plain(send, 421, b"unknown Host; see --allowed-hosts\n")
                return
        if self._user is not None:
            if not self._authorized(headers.get(b"authorization")):
                await _plain(send, 401, b"authentication required\n",
                             [(b"www-authenticate", self._challenge)])
                return
            scope = {**scope, "celeriac.user": self._user.decode("utf-8", "replace")}

        async def send_with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *HEADERS]}
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _authorized(self, header: bytes | None) -> bool:
        assert self._user is not None and self._password is not None
        if not header or header[:6].lower() != b"basic ":
            return False
        try:
            decoded = base64.b64decode(header[6:].strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        user, sep, password = decoded.partition(b":")
        # Both compared, always: no early exit tells a caller which half was wrong.
        user_ok = hmac.compare_digest(user, self._user)
        password_ok = hmac.compare_digest(password, self._password)
        return bool(sep) and user_ok and password_ok


async def _plain(send: Any, status: int, body: bytes,
                 extra: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()),
                            *HEADERS, *(extra or [])]})
    await send({"type": "http.response.body", "body": body})
