"""``celeriac`` command line: ``celeriac -A module[:app] <command>``.

One module per command group. Errors a user can fix (unknown module, bad URL,
unreachable broker) print one line and exit with status 1, never a traceback.

A command's module is imported when the command runs (``CLIGroup``, click's lazy group):
``celeriac --help`` lists every command without importing the worker, the dashboard or
the app. A command is added with one line in ``LAZY`` (``main.add_command`` works too).
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from ..__about__ import __version__
from ..errors import CeleriacError
from .loader import AppLoader

LAZY: dict[str, tuple[str, str]] = {
    # name: (module under celeriac.cli, its first sentence, which ``--help`` lists)
    "beat": ("beat", "Run a beat, which sends periodic tasks when due; with a subcommand, "
                     "change its entries."),
    "call": ("tasks", "Send task NAME by name and print its id."),
    "control": ("control", "Change running workers: COMMAND is one of the control commands "
                           "below."),
    "dashboard": ("dashboard", "Serve the web dashboard (live workers, tasks, queues, charts) "
                               "and /metrics."),
    "dead": ("dead", "Inspect, requeue and purge dead-lettered messages."),
    "events": ("events", "Watch events: a live view of workers and tasks (quit with q or "
                         "Ctrl-C), or one line per event (--dump), or periodic snapshots "
                         "(--camera)."),
    "health": ("health", "Exit 0 while the worker's event loop is turning, 1 (with the "
                         "reason) if not."),
    "inspect": ("control", "Ask the workers: COMMAND is one of the inspect commands below."),
    "multi": ("multi", "Start, stop or restart several detached workers."),
    "outbox": ("outbox", "The transactional outbox (``app.transaction(conn)``): relay and "
                         "status."),
    "purge": ("tasks", "Delete every waiting message in the queues."),
    "report": ("report", "Print versions and settings (secrets masked) for a bug report."),
    "result": ("tasks", "Print the state and result of TASK_ID."),
    "revoke": ("control", "Revoke TASK_IDS: workers will not run them (remembered for "
                          "worker_revoke_expires, also by workers that start later)."),
    "shell": ("shell", "Start a Python shell with app, celery (the app), celeriac and every "
                       "task by name."),
    "status": ("control", "The workers online (they answer ping)."),
    "worker": ("worker", "Start a worker that executes tasks."),
}
"""The commands, each imported when it runs; the sentence is what ``--help`` lists (a test
checks it against the command's own help)."""


class CLIGroup(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CeleriacError as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from None

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *LAZY})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in LAZY:
            module = importlib.import_module(f"{__name__}.{LAZY[cmd_name][0]}")
            command = getattr(module, cmd_name)
            if not isinstance(command, click.Command):
                raise TypeError(f"celeriac.cli.{LAZY[cmd_name][0]}.{cmd_name} is not a command")
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # click's own listing, but a command not yet imported is listed from its sentence in
        # LAZY, through a stand-in command so that click shortens it the same way.
        commands = [(name, self.commands.get(name) or click.Command(name, help=LAZY[name][1]))
                    for name in self.list_commands(ctx)]
        commands = [(name, cmd) for name, cmd in commands if not cmd.hidden]
        if not commands:
            return
        limit = formatter.width - 6 - max(len(name) for name, _ in commands)
        rows = [(name, cmd.get_short_help_str(limit)) for name, cmd in commands]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=CLIGroup)
@click.option("-A", "--app", "app_spec", envvar="CELERIAC_APP", metavar="MODULE[:APP]",
              help="The module holding your Celeriac app.")
@click.version_option(__version__, prog_name="celeriac")
@click.pass_context
def main(ctx: click.Context, app_spec: str | None) -> None:
    """celeriac: a distributed task queue."""
    ctx.obj = AppLoader(app_spec)
