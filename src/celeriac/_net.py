"""What every broker and result-store client shares: reconnect backoff, and URLs fit to
print (passwords masked)."""

from __future__ import annotations

import random
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit


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
