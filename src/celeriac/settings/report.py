"""What a bug report may show of the settings, with nothing secret: settings whose name
looks secret (Celery's ``HIDDEN_SETTINGS``) are masked whole, at any depth of a mapping,
and every string that looks like a URL has its password masked. Used by ``celeriac
report`` (``cli/report.py``) and the ``conf``/``report`` inspect commands.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import re
from collections.abc import Mapping
from typing import Any

from ..clients.net import mask_password
from . import Settings

HIDDEN_SETTINGS = re.compile(
    "API|TOKEN|KEY|SECRET|PASS|PROFANITIES_LIST|SIGNATURE|DATABASE", re.IGNORECASE,
)
MASK = "*" * 8
CLIENT_LIBRARIES = ("redis", "hiredis", "pika", "psycopg", "orjson", "uvloop")

# A user info that urlsplit cannot see (an unquoted "/", "#" or "?" in the password):
# everything from the first ":" after the scheme up to the last "@" is masked.
_RAW_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^:/@]*:).*@")


def mask_url(value: str) -> str:
    """``value`` with the password of each ``;``-separated URL in it masked."""
    parts = []
    for part in value.split(";"):
        masked = mask_password(part) if "://" in part else part
        if masked == part and "@" in part:
            masked = _RAW_USERINFO.sub(r"\1***@", part)
        parts.append(masked)
    return ";".join(parts)


def censor(key: object, value: Any) -> Any:
    """``value`` fit to print under setting (or mapping key) ``key``."""
    if isinstance(key, str) and HIDDEN_SETTINGS.search(key):
        return MASK
    if isinstance(value, Mapping):
        return {k: censor(k, v) for k, v in value.items()}
    if isinstance(value, str):
        return mask_url(value)
    if isinstance(value, (list, tuple)):
        return type(value)(censor(None, v) for v in value)
    return value


def _describe(value: Any) -> str:
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    if callable(value):
        name = getattr(value, "__qualname__", None) or type(value).__name__
        return f"<function {getattr(value, '__module__', '?')}.{name}>"
    if isinstance(value, tuple) and any(isinstance(v, type) for v in value):
        return "(" + ", ".join(_describe(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


def settings_lines(settings: Settings) -> list[str]:
    return [f"{f.name}: {_describe(censor(f.name, getattr(settings, f.name)))}"
            for f in dataclasses.fields(settings)]


def installed_clients() -> list[str]:
    found = []
    for name in CLIENT_LIBRARIES:
        try:
            found.append(f"{name}:{importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return found
