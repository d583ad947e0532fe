"""What every broker and result-store client shares: reconnect backoff, the retry policy
of the call in progress, and URLs fit to print (passwords masked)."""

from __future__ import annotations

import contextlib
import contextvars
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

if TYPE_CHECKING:
    from ..settings import Settings

_policy: contextvars.ContextVar[tuple[bool, int | None] | None] = contextvars.ContextVar(
    "celeriac.retry_policy", default=None)


def retry_policy(settings: Settings) -> tuple[bool, int | None]:
    """(retry?, max retries or None for forever) for the synchronous call in progress:
    ``apply_async(retry=, retry_policy=)``'s, else the settings'."""
    return _policy.get() or (settings.broker_connection_retry,
                             settings.broker_connection_max_retries)


@contextlib.contextmanager
def retrying(retry: bool, max_retries: int | None) -> Iterator[None]:
    """Publish with this retry policy inside the block (this thread or task only)."""
    token = _policy.set((retry, max_retries))
    try:
        yield
    finally:
        _policy.reset(token)


def backoff(attempt: int, base: float = 0.2, cap: float = 10.0) -> float:
    """Seconds before retry ``attempt``: exponential with full jitter, uniform in
    [0, min(cap, base * 2**attempt)) plus 50 ms, so that a fleet of workers or producers
    does not retry in lockstep."""
    return random.uniform(0, min(cap, base * 2 ** min(attempt, 16))) + 0.05


def mask_password(url: str) -> str:
    """``url`` with its password (in the user info or a ``password=`` parameter) as
    ``***``, for messages and logs; of several ``;``-separated URLs, each."""
    if ";" in url:
        return ";".join(mask_password(u) for u in url.split(";"))
    parts = urlsplit(url.strip())
    netloc = parts.netloc
    if parts.password is not None:
        userinfo, _, host = netloc.rpartition("@")
        netloc = f"{userinfo.partition(':')[0]}:***@{host}"
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(k == "password" for k, _ in query):
        masked = urlencode([(k, "***" if k == "password" else v) for k, v in query], safe="*")
        return urlunsplit(parts._replace(netloc=netloc, query=masked))
    return urlunsplit(parts._replace(netloc=netloc))
