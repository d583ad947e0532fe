"""``celeriac beat``: run a beat (any number of them may run), or change its entries.

``celeriac -A proj beat [--max-interval S] [-S SCHEDULER] [-l info]`` runs one until SIGINT/SIGTERM;
``celeriac beat list | add | remove | enable | disable | run NAME`` change the shared
store at runtime (every running beat sees the change at its next tick).
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import timedelta
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ..beat import schedules
from ..beat.runner import run_standalone
from ..errors import ConfigurationError
from .loader import AppLoader
from .worker import LEVELS, setup_logging


def _schedule(value: str) -> schedules.BaseSchedule:
    """``30`` / ``30s`` / ``5m`` / ``1h`` (an interval) or a crontab line."""
    text = value.strip()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if text[-1:] in units and text[:-1].replace(".", "", 1).isdigit():
            return schedules.schedule(timedelta(seconds=float(text[:-1]) * units[text[-1]]))
        if text.replace(".", "", 1).isdigit():
            return schedules.schedule(float(text))
        return schedules.crontab.from_string(text)
    except (ValueError, TypeError) as exc:
        raise click.BadParameter(str(exc), param_hint="SCHEDULE") from None


def _json(value: str | None, what: str, kind: type) -> Any:
    if value is None:
        return kind()
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint=what) from None
    if not isinstance(parsed, kind):
        raise click.BadParameter(f"expected a JSON {kind.__name__}", param_hint=what)
    return parsed


@click.group(invoke_without_command=True)
@click.option("--max-interval", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Longest sleep between checks (default: beat_max_loop_interval).")
@click.option("-l", "--loglevel", type=click.Choice(LEVELS, case_sensitive=False),
              default="warning", show_default=True)
@click.option("-S", "--scheduler", default=None, metavar="NAME",
              help="beat_scheduler for this beat: "
                   "django_celery_beat.schedulers:DatabaseScheduler reads the Django "
                   "admin's schedules (default: the setting).")
@click.pass_context
def beat(ctx: click.Context, max_interval: float | None, loglevel: str,
         scheduler: str | None) -> None:
    """Run a beat, which sends periodic tasks when due; with a subcommand, change its
    entries. Any number of beats may run: one leads, the others take over if it stops."""
    setup_logging(loglevel)
    if ctx.invoked_subcommand is not None:
        return
    app = ctx.obj()
    if scheduler is not None:
        try:
            app.conf.update(beat_scheduler=scheduler)
        except ConfigurationError as exc:
            raise click.BadParameter(str(exc), param_hint="--scheduler") from None
    app.finalize()
    sys.exit(asyncio.run(run_standalone(app, max_interval)))


@beat.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_obj
def list_(load: AppLoader, as_json: bool) -> None:
    """Show every entry: schedule, enabled, last and next run, and which beat leads."""
    api = load().beat
    rows, leader = api.list(), api.leader()
    if as_json:
        click.echo(json.dumps({"entries": rows, "leader": leader}, default=str))
        return
    table = Table(title=f"leader: {leader['beat'] if leader else 'none'}",
                  title_justify="left")
    for col in ("name", "task", "schedule", "enabled", "last run", "next run"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], r["task"], r["schedule"], "yes" if r["enabled"] else "no",
                      r["last_run"] or "-", r["next_run"] or "-")
    Console(width=200).print(table)


@beat.command()
@click.argument("name")
@click.argument("task")
@click.argument("schedule")
@click.option("--args", default=None, help="JSON list of positional arguments.")
@click.option("--kwargs", default=None, help="JSON object of keyword arguments.")
@click.option("--options", default=None,
              help='JSON object of options, e.g. {"queue": "q", "expires": 60}.')
@click.pass_obj
def add(load: AppLoader, name: str, task: str, schedule: str, args: str | None,
        kwargs: str | None, options: str | None) -> None:
    """Add (or replace) entry NAME running TASK on SCHEDULE: seconds (30, 5m, 1h) or a
    crontab line ("*/5 * * * *")."""
    entry = load().beat.add(name, task, _schedule(schedule), _json(args, "--args", list),
                            _json(kwargs, "--kwargs", dict), _json(options, "--options", dict))
    click.echo(f"added {entry.name}: {entry.task} {entry.schedule}")


@beat.command()
@click.argument("name")
@click.pass_obj
def remove(load: AppLoader, name: str) -> None:
    """Delete entry NAME."""
    if not load().beat.remove(name):
        raise click.ClickException(f"no beat entry named {name!r} in the store")
    click.echo(f"removed {name}")


@beat.command()
@click.argument("name")
@click.pass_obj
def enable(load: AppLoader, name: str) -> None:
    """Run entry NAME on its schedule again."""
    load().beat.enable(name)
    click.echo(f"enabled {name}")


@beat.command()
@click.argument("name")
@click.pass_obj
def disable(load: AppLoader, name: str) -> None:
    """Stop running entry NAME (it stays in the store)."""
    load().beat.disable(name)
    click.echo(f"disabled {name}")


@beat.command()
@click.argument("name")
@click.pass_obj
def run(load: AppLoader, name: str) -> None:
    """Send entry NAME's task now, outside its schedule."""
    click.echo(load().beat.run(name))
