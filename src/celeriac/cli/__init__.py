"""``celeriac`` command line: ``celeriac -A module[:app] <command>``.

Errors a user can fix (unknown module, bad URL, unreachable broker) print one line and
exit with status 2, never a traceback.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from ..__about__ import __version__
from ..app import Celeriac
from ..errors import CeleriacError


class AppLoader:
    def __init__(self, spec: str | None) -> None:
        self.spec = spec
        self._app: Celeriac | None = None

    def __call__(self) -> Celeriac:
        if self._app is None:
            self._app = load_app(self.spec)
        return self._app


def load_app(spec: str | None) -> Celeriac:
    """``module`` or ``module:attribute``; without a spec, an app on the default broker."""
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


class CLIGroup(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CeleriacError as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from None


@click.group(cls=CLIGroup)
@click.option("-A", "--app", "app_spec", envvar="CELERIAC_APP", metavar="MODULE[:APP]",
              help="The module holding your Celeriac app.")
@click.version_option(__version__, prog_name="celeriac")
@click.pass_context
def main(ctx: click.Context, app_spec: str | None) -> None:
    """celeriac: a distributed task queue."""
    ctx.obj = AppLoader(app_spec)


from . import tasks as _tasks  # noqa: E402
from . import worker as _worker  # noqa: E402

main.add_command(_worker.worker)
for _cmd in (_tasks.call, _tasks.result, _tasks.purge):
    main.add_command(_cmd)
