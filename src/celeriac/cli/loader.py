"""Finding the user's app from ``-A module[:attribute]``."""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from ..app import Celeriac


class AppLoader:
    """Loads the app on first use, so ``--help`` never imports user code."""

    def __init__(self, spec: str | None) -> None:
        self.spec = spec
        self._app: Celeriac | None = None

    def __call__(self) -> Celeriac:
        if self._app is None:
            self._app = load_app(self.spec)
        return self._app


def load_app(spec: str | None) -> Celeriac:
    """``module`` or ``module:attribute``; without a spec, an app on the default broker."""
    from ..app import Celeriac  # deferred: ``celeriac --help`` never loads the app

    if not spec:
        return Celeriac()
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise click.ClickException(f"cannot import app module {module_name!r}: "
                                       f"no module named {exc.name!r}") from None
        raise
    if attr:
        app = getattr(module, attr, None)
        if not isinstance(app, Celeriac):
            raise click.ClickException(f"{module_name}:{attr} is not a Celeriac app")
        return app
    for name in ("app", "celery", "celeriac"):
        if isinstance(candidate := getattr(module, name, None), Celeriac):
            return candidate
    apps = [v for v in vars(module).values() if isinstance(v, Celeriac)]
    if len(apps) == 1:
        return apps[0]
    raise click.ClickException(
        f"no Celeriac app found in module {module_name!r}; name it: -A {module_name}:app"
    )
