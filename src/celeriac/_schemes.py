"""URL schemes -> classes, for transports, result backends and shared stores alike: one
mechanism.

A registry holds loaders (module paths and class names, imported only when their scheme
is first used, so a client library is needed only by those who use it) and classes
registered by third parties (``celeriac.transports.register``,
``celeriac.backends.register``).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Generic, TypeVar
from urllib.parse import urlsplit

from .errors import ConfigurationError

T = TypeVar("T")


class SchemeRegistry(Generic[T]):
    def __init__(self, kind: str, noun: str, builtin: Mapping[str, tuple[str, str]]) -> None:
        self.kind = kind
        """What a URL of it names, for messages: "broker", "result backend"."""
        self.noun = noun
        """What the class is, for messages: "transport", "result backend"."""
        self._builtin = dict(builtin)
        self._registered: dict[str, type[T]] = {}

    def register(self, scheme: str, cls: type[T]) -> None:
        self._registered[scheme] = cls

    def known(self) -> list[str]:
        return sorted({*self._builtin, *self._registered})

    def handles(self, url: str) -> bool:
        """Whether ``url``'s scheme has a class here (nothing is imported)."""
        scheme = urlsplit(url).scheme
        return scheme in self._registered or scheme in self._builtin

    def lookup(self, url: str) -> type[T]:
        """The class for ``url``'s scheme; ``ConfigurationError`` naming the known
        schemes, or the extra to install."""
        scheme = urlsplit(url).scheme
        if scheme in self._registered:
            return self._registered[scheme]
        if scheme not in self._builtin:
            raise ConfigurationError(
                f"unknown {self.kind} URL scheme {scheme!r} in {url!r}; known: "
                + ", ".join(f"{s}://" for s in self.known()))
        module, name = self._builtin[scheme]
        try:
            cls: type[T] = getattr(importlib.import_module(module), name)
        except ImportError as exc:
            raise ConfigurationError(
                f"the {scheme}:// {self.noun} needs {exc.name!r}: "
                f"pip install 'celeriac[{scheme}]'") from exc
        return cls
