"""``celeriac call``, ``celeriac result``, ``celeriac purge``."""

from __future__ import annotations

from typing import Any

import click
import orjson

from .loader import AppLoader


def _json(value: str, name: str, kind: type) -> Any:
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint=name) from None
    if not isinstance(parsed, kind):
        raise click.BadParameter(f"must be a JSON {kind.__name__}", param_hint=name)
    return parsed


@click.command()
@click.argument("name")
@click.option("--args", "args_json", default="[]", help="Positional arguments, a JSON list.")
@click.option("--kwargs", "kwargs_json", default="{}", help="Keyword arguments, a JSON object.")
@click.option("--countdown", type=float, default=None)
@click.option("-Q", "--queue", default=None)
@click.option("--priority", type=click.IntRange(0, 9), default=None)
@click.option("--wait", "wait", type=float, default=None, metavar="SECONDS",
              help="Wait for the result and print it.")
@click.pass_obj
def call(load: AppLoader, name: str, args_json: str, kwargs_json: str, countdown: float | None,
         queue: str | None, priority: int | None, wait: float | None) -> None:
    """Send task NAME by name and print its id."""
    args = _json(args_json, "--args", list)
    kwargs = _json(kwargs_json, "--kwargs", dict)
    result = load().send_task(name, args, kwargs, countdown=countdown, queue=queue,
                              priority=priority)
    click.echo(result.id)
    if wait is not None:
        click.echo(orjson.dumps(result.get(timeout=wait)).decode())


@click.command()
@click.argument("task_id")
@click.option("--traceback", "show_tb", is_flag=True, help="Print the traceback of a failure.")
@click.pass_obj
def result(load: AppLoader, task_id: str, show_tb: bool) -> None:
    """Print the state and result of TASK_ID."""
    meta = load().backend.get(task_id)
    if meta is None:
        click.echo("PENDING")
        return
    click.echo(f"{meta.state} {orjson.dumps(meta.result).decode()}")
    if show_tb and meta.traceback:
        click.echo(meta.traceback)


@click.command()
@click.option("-Q", "--queues", default=None,
              help="Comma-separated queues (default: the worker's, task_queues or the "
                   "default queue).")
@click.option("-f", "--force", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def purge(load: AppLoader, queues: str | None, force: bool) -> None:
    """Delete every waiting message in the queues."""
    app = load()
    names = [q.strip() for q in queues.split(",")] if queues else app.default_queues
    waiting = sum(app.transport.queue_length(q) for q in names)
    if not force:
        click.confirm(f"Purge {waiting} message(s) from {', '.join(names)}?", abort=True)
    removed = sum(app.transport.purge(q) for q in names)
    click.echo(f"purged {removed} message(s) from {', '.join(names)}")
