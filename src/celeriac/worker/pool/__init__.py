"""Execution pools behind one interface (``base.Pool``)."""

from __future__ import annotations

from .base import Pool
from .solo import SoloPool

POOLS: dict[str, type[Pool]] = {"solo": SoloPool}

__all__ = ["POOLS", "Pool", "SoloPool"]
