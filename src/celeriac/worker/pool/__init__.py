"""Execution pools behind one interface (``base.Pool``)."""

from __future__ import annotations

from .base import Pool
from .prefork import PreforkPool
from .solo import SoloPool
from .threads import ThreadsPool

POOLS: dict[str, type[Pool]] = {"solo": SoloPool, "prefork": PreforkPool,
                                "threads": ThreadsPool}

__all__ = ["POOLS", "Pool", "PreforkPool", "SoloPool", "ThreadsPool"]
