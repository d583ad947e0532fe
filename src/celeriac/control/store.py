"""Revoked ids are kept in the deployment's shared store (``celeriac.stores``: which
store, and ``SharedStore.revoke``/``load_if_changed``), so that a revoke is not
forgotten: ``app.control.revoke`` records the ids (with the workers' expiry) before it
broadcasts, and a worker loads them at start and whenever their version moves
(``worker/revoked.py``), so a worker that starts later, restarts, or missed the
broadcast still honours it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..stores import SharedStore, find_url, open_store

if TYPE_CHECKING:
    from ..app import Celeriac

def store_for(app: Celeriac) -> SharedStore | None:
    """``app``'s shared store, where revoked ids are kept; None where there is none (a
    revoke is then remembered by the broadcast and ``--statedb`` only)."""
    url = find_url(app.settings)
    return open_store(app.settings, url) if url is not None else None
