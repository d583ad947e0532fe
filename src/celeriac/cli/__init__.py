"""``celeriac`` command line: ``celeriac -A module[:app] <command>``.

One module per command group. Errors a user can fix (unknown module, bad URL,
unreachable broker) print one line and exit with status 1, never a traceback.
"""

from __future__ import annotations

from typing import Any

import click

from ..__about__ import __version__
from ..errors import CeleriacError
from .beat import beat
from .control import control, inspect, revoke, status
from .dashboard import dashboard
from .dead import dead
from .events import events
from .health import health
from .loader import AppLoader
from .multi import multi
from .outbox import outbox
from .report import report
from .shell import shell
from .tasks import call, purge, result
from .worker import worker


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


for _command in (worker, beat, call, result, purge, dead, events, dashboard, report,
                 shell, multi, health, inspect, control, status, revoke, outbox):
    main.add_command(_command)
