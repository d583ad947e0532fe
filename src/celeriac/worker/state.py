"""Celery's ``celery.worker.state`` where code written for Celery reaches it:
``revoked_stamps``, the stamped headers flagged for revoking.

``app.control.revoke_by_stamped_headers({"monitoring_id": ["a", "b"]})`` makes every
worker that hears it add the values here (``header -> list of values``, Celery's
mapping); the consumer then refuses a message whose stamps match (``REVOKED``, acked
unrun), where it refuses revoked ids (``Consumer._on_delivery``). As in Celery the
mapping belongs to the process (workers in one process share it), lives in memory only
(no statedb, no shared store: a worker started later does not know it) and is cleared
by ``revoked_stamps.clear()``.

A message's stamps are Celery's wire: the header ``stamped_headers`` (the names) and
``stamps`` (name -> value, or list of values). A message matches when one of its stamped
headers has a value (or one of its values) among the revoked values of that header.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

revoked_stamps: dict[str, Any] = {}
"""Stamped header name -> the revoked values (a list; Celery's ``revoked_stamps``)."""


def _as_list(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple, set, frozenset)):
        return list(value)
    return [value]


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def add_revoked_stamps(headers: Mapping[str, Any]) -> None:
    """Flag these ``header -> value(s)`` as revoked (added to what is flagged)."""
    for header, values in headers.items():
        known = _as_list(revoked_stamps.get(header) or [])
        known.extend(v for v in _as_list(values) if v not in known)
        revoked_stamps[header] = known


def message_stamps(headers: Mapping[str, Any]) -> dict[str, Any]:
    """A message's stamps: ``stamped_headers`` names, their values from ``stamps``
    (Celery's ``Request.stamps``); {} for a message without (or with malformed) ones."""
    names = headers.get("stamped_headers")
    stamps = headers.get("stamps")
    if not names or not isinstance(stamps, Mapping):
        return {}
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, (list, tuple)):
        return {}
    return {n: stamps.get(n) for n in names if isinstance(n, str)}


def stamps_match(stamps: Mapping[str, Any], revoked: Mapping[str, Any]) -> dict[str, list[Any]]:
    """The ``header -> values`` of ``stamps`` that ``revoked`` flags ({}: none)."""
    out: dict[str, list[Any]] = {}
    for name, value in stamps.items():
        if value is None or name not in revoked:
            continue
        flagged = _as_list(revoked[name])
        hits = [v for v in _as_list(value) if _hashable(v) and v in flagged]
        if hits:
            out[name] = hits
    return out


def revoking_stamps(headers: Mapping[str, Any]) -> dict[str, list[Any]]:
    """Which of this message's stamps are revoked ({}: it may run). The consumer calls
    it only while something is flagged and the message has ``stamped_headers``."""
    return stamps_match(message_stamps(headers), revoked_stamps)


__all__ = ["add_revoked_stamps", "message_stamps", "revoked_stamps", "revoking_stamps",
           "stamps_match"]
