"""Execution pools behind one interface (``base.Pool``)."""

from __future__ import annotations

from .base import Pool
from .prefork import PreforkPool
from .solo import SoloPool

POOLS: dict[str, type[Pool]] = {"solo": SoloPool, "prefork": PreforkPool}

__all__ = ["POOLS", "Pool", "PreforkPool", "SoloPool"]
