"""Brokers: one module per transport, one interface (``base.Transport``)."""

from .base import DeadLetter, Outgoing, Transport, create_transport, known_schemes

__all__ = ["DeadLetter", "Outgoing", "Transport", "create_transport", "known_schemes"]
