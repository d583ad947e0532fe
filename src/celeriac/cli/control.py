"""``celeriac inspect``, ``celeriac control``, ``celeriac status`` and ``celeriac revoke``,
in Celery's form::

    celeriac -A proj inspect active [-d w1@host,w2@host] [-t 1.0] [--json]
    celeriac -A proj control rate_limit proj.add 10/m
    celeriac -A proj status
    celeriac -A proj revoke ID... [--terminate] [--signal SIGKILL]

Replies print as a table (one row per node) or, with ``--json``, as one JSON object
``{node: reply}``. No reply within the timeout exits with status 1 ("No nodes replied",
as Celery's), and so does any error reply.
"""

from __future__ import annotations

import sys
from typing import Any

import click
import orjson
from rich.console import Console
from rich.table import Table

from ..control import merge
from ..control.registry import CommandSpec, convert
from ..control.registry import load as load_commands
from ..errors import ControlError
from .loader import AppLoader


def _commands(kind: str) -> dict[str, CommandSpec]:
    return {n: c for n, c in load_commands().items() if c.kind == kind and n != "hello"}


def _destination(value: str | None) -> list[str] | None:
    return [d.strip() for d in value.split(",") if d.strip()] if value else None


_options = [
    click.option("-t", "--timeout", type=click.FloatRange(min=0), default=1.0,
                 show_default=True, help="Seconds to wait for replies."),
    click.option("-d", "--destination", default=None, metavar="NODE[,NODE...]",
                 help="Only these workers (node names); returns once all replied."),
    click.option("-j", "--json", "as_json", is_flag=True, default=False,
                 help="Print the replies as one JSON object."),
]


def _with_options(fn: Any) -> Any:
    for option in reversed(_options):
        fn = option(fn)
    return fn


def _usage(kind: str) -> str:
    lines = [f"  {name} {spec.signature}".rstrip() + f"\n      {spec.help}"
             for name, spec in sorted(_commands(kind).items())]
    return "\n".join(lines)


def _run(load: AppLoader, kind: str, command: str, words: tuple[str, ...],
         timeout: float, destination: str | None, as_json: bool) -> None:
    specs = _commands(kind)
    spec = specs.get(command)
    if spec is None:
        raise click.UsageError(f"unknown {kind} command {command!r}; one of: "
                               f"{', '.join(sorted(specs))}")
    try:
        arguments = convert(spec, words)
        spec.check(arguments)
    except ControlError as exc:
        raise click.UsageError(str(exc)) from None
    app = load()
    try:
        replies = app.control.broadcast(command, arguments, _destination(destination),
                                        reply=True, timeout=timeout)
    finally:
        app.control.close()
    show(merge(replies), as_json)


def show(replies: dict[str, Any] | None, as_json: bool) -> None:
    """Print ``{node: reply}``; exit 1 when nobody replied or a node replied an error."""
    if not replies:
        click.echo("Error: No nodes replied within time constraint.", err=True)
        sys.exit(1)
    if as_json:
        click.echo(orjson.dumps(replies, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS,
                                default=repr).decode())
    else:
        table = Table(show_edge=False, show_lines=True)
        table.add_column("node")
        table.add_column("reply", overflow="fold")
        for node, reply in sorted(replies.items()):
            table.add_row(node, render(reply))
        Console(width=None if sys.stdout.isatty() else 250).print(table)
        click.echo(f"{len(replies)} node{'s' if len(replies) != 1 else ''} online.")
    if any(isinstance(r, dict) and set(r) == {"error"} for r in replies.values()):
        sys.exit(1)


def render(reply: Any) -> str:
    """One node's reply as text for the table."""
    if isinstance(reply, dict) and len(reply) == 1 and set(reply) & {"ok", "error"}:
        key, value = next(iter(reply.items()))
        return f"{'OK' if key == 'ok' else 'ERROR'}: {value}"
    if isinstance(reply, list):
        if not reply:
            return "- empty -"
        return "\n".join(_item(x) for x in reply)
    if isinstance(reply, dict):
        return "\n".join(f"{k}: {_value(v)}" for k, v in reply.items()) or "- empty -"
    return _value(reply)


def _item(x: Any) -> str:
    if isinstance(x, dict) and "id" in x and "name" in x:
        return f"{x['name']}[{x['id']}] args={x.get('args')} kwargs={x.get('kwargs')}"
    return _value(x)


def _value(v: Any) -> str:
    if isinstance(v, str):
        return v
    return orjson.dumps(v, option=orjson.OPT_SORT_KEYS, default=repr).decode()


@click.command(context_settings={"ignore_unknown_options": False},
               epilog="Commands:\n\n" + "\b\n" + "COMMANDS_INSPECT")
@click.argument("command")
@click.argument("args", nargs=-1)
@_with_options
@click.pass_obj
def inspect(load: AppLoader, command: str, args: tuple[str, ...], timeout: float,
            destination: str | None, as_json: bool) -> None:
    """Ask the workers: COMMAND is one of the inspect commands below."""
    _run(load, "inspect", command, args, timeout, destination, as_json)


@click.command(epilog="Commands:\n\n" + "\b\n" + "COMMANDS_CONTROL")
@click.argument("command")
@click.argument("args", nargs=-1)
@_with_options
@click.pass_obj
def control(load: AppLoader, command: str, args: tuple[str, ...], timeout: float,
            destination: str | None, as_json: bool) -> None:
    """Change running workers: COMMAND is one of the control commands below."""
    _run(load, "control", command, args, timeout, destination, as_json)


@click.command()
@_with_options
@click.pass_obj
def status(load: AppLoader, timeout: float, destination: str | None, as_json: bool) -> None:
    """The workers online (they answer ping)."""
    app = load()
    try:
        replies = merge(app.control.ping(destination=_destination(destination),
                                         timeout=timeout))
    finally:
        app.control.close()
    if not replies:
        click.echo("Error: No nodes replied within time constraint.", err=True)
        sys.exit(1)
    if as_json:
        click.echo(orjson.dumps(replies, option=orjson.OPT_SORT_KEYS).decode())
        return
    for node in sorted(replies):
        click.echo(f"{node}: OK")
    click.echo(f"\n{len(replies)} node{'s' if len(replies) != 1 else ''} online.")


@click.command()
@click.argument("task_ids", nargs=-1, required=True)
@click.option("--terminate", is_flag=True, default=False,
              help="Also kill the child running the task (prefork).")
@click.option("-s", "--signal", "signal_name", default="SIGTERM", show_default=True,
              help="The signal --terminate sends, e.g. SIGKILL.")
@_with_options
@click.pass_obj
def revoke(load: AppLoader, task_ids: tuple[str, ...], terminate: bool, signal_name: str,
           timeout: float, destination: str | None, as_json: bool) -> None:
    """Revoke TASK_IDS: workers will not run them (remembered for
    worker_revoke_expires, also by workers that start later)."""
    app = load()
    try:
        replies = app.control.revoke(list(task_ids), destination=_destination(destination),
                                     terminate=terminate, signal=signal_name, reply=True,
                                     timeout=timeout)
    finally:
        app.control.close()
    show(merge(replies), as_json)


def _fill_epilogs() -> None:
    # Click reads the epilog when it prints help; the registry loads on first use only.
    assert inspect.epilog is not None and control.epilog is not None
    inspect.epilog = inspect.epilog.replace("COMMANDS_INSPECT", _usage("inspect"))
    control.epilog = control.epilog.replace("COMMANDS_CONTROL", _usage("control"))


_fill_epilogs()
