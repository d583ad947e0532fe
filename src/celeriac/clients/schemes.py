"""URL schemes -> classes, for transports, result backends and shared stores alike: one
mechanism.

A registry holds loaders (module paths and class names, imported only when their scheme
is first used, so a client library is needed only by those who use it) and classes
registered by third parties (``celeriac.transports.register``,
``celeriac.backends.register``).

A URL's ``layout`` query parameter picks a class of Celery's compatibility mode
(``redis://...?layout=kombu``: kombu's Redis layout, shared with Celery's workers;
``redis://...?layout=celery``: Celery's result keys); its loaders sit in the same
registry, keyed by scheme and layout. Without ``layout`` a URL means celeriac's own
layout; any other value is an error naming the known ones.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Generic, TypeVar
from urllib.parse import parse_qsl, urlsplit

from ..errors import ConfigurationError

T = TypeVar("T")


class SchemeRegistry(Generic[T]):
    def __init__(self, kind: str, noun: str, builtin: Mapping[str, tuple[str, str]],
                 layouts: Mapping[tuple[str, str], tuple[str, str]] | None = None) -> None:
        self.kind = kind
        """What a URL of it names, for messages: "broker", "result backend"."""
        self.noun = noun
        """What the class is, for messages: "transport", "result backend"."""
        self._builtin = dict(builtin)
        self._layouts = dict(layouts or {})
        """(scheme, layout) -> loader: the classes a URL's ``?layout=`` selects."""
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
        """The class for ``url``'s scheme (and ``layout`` parameter); ``ConfigurationError``
        naming the known schemes or layouts, or the extra to install."""
        scheme = urlsplit(url).scheme
        # A registry without layouts (the shared stores') reads what every layout keeps
        # alike: a kombu-layout broker's server is still a shared store.
        chosen = layout(url) if self._layouts else None
        if chosen is not None:
            entry = self._layouts.get((scheme, chosen))
            if entry is None:
                known = sorted(f"{s}://...?layout={name}" for s, name in self._layouts)
                raise ConfigurationError(
                    f"layout={chosen!r} is not a {self.kind} layout for {scheme}:// URLs; "
                    "known: " + ", ".join(known))
            return self._load(scheme, entry)
        if scheme in self._registered:
            return self._registered[scheme]
        if scheme not in self._builtin:
            raise ConfigurationError(
                f"unknown {self.kind} URL scheme {scheme!r} in {url!r}; known: "
                + ", ".join(f"{s}://" for s in self.known()))
        return self._load(scheme, self._builtin[scheme])

    def _load(self, scheme: str, entry: tuple[str, str]) -> type[T]:
        module, name = entry
        try:
            cls: type[T] = getattr(importlib.import_module(module), name)
        except ImportError as exc:
            raise ConfigurationError(
                f"the {scheme}:// {self.noun} needs {exc.name!r}: "
                f"pip install 'celeriac[{scheme}]'") from exc
        return cls


def layout(url: str) -> str | None:
    """The URL's ``layout`` parameter, or None."""
    for name, value in parse_qsl(urlsplit(url.strip()).query, keep_blank_values=True):
        if name == "layout":
            return value
    return None
