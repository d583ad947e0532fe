"""What beats share lives in the deployment's shared store (``celeriac.stores``: the
beat lease, the entries, their last due times and the run keys; which store, and the
operations, are described there). ``BeatStore`` is that store's interface under the
name beat has always used."""

from __future__ import annotations

from ..stores import (
    BEAT_LEASE,
    LEDGER_LENGTH,
    RUN_KEY_TTL,
    Lease,
    Run,
    open_store,
    parse_run_key,
    run_key,
    store_url,
)
from ..stores import SharedStore as BeatStore

__all__ = ["BEAT_LEASE", "LEDGER_LENGTH", "RUN_KEY_TTL", "BeatStore", "Lease", "Run",
           "open_store", "parse_run_key", "run_key", "store_url"]
