"""Result backends: one module per store, one interface (``base.ResultBackend``)."""

from .base import ResultBackend, ResultMeta, create_backend

__all__ = ["ResultBackend", "ResultMeta", "create_backend"]
