"""``celeriac dead list|show|requeue|purge``: the dead-letter store."""

from __future__ import annotations

import sys
import time

import click
import orjson
from rich.console import Console
from rich.table import Table

from ..errors import DecodeError
from ..protocol import Message
from ..serialization import compression
from ..transports.base import DeadLetter
from .loader import AppLoader

LIMIT = 10_000


@click.group()
def dead() -> None:
    """Inspect, requeue and purge dead-lettered messages."""


def _find(load: AppLoader, ids: tuple[str, ...]) -> list[DeadLetter]:
    letters = load().transport.dead_letters(LIMIT)
    wanted = set(ids)
    found = [d for d in letters if str(d.id) in wanted]
    missing = wanted - {str(d.id) for d in found}
    if missing:
        raise click.ClickException(f"no dead letter with id {', '.join(sorted(missing))}")
    return found


@dead.command("list")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.pass_obj
def list_(load: AppLoader, limit: int) -> None:
    """The oldest dead letters first: id, queue, task, reason."""
    letters = load().transport.dead_letters(limit)
    if not letters:
        click.echo("no dead letters")
        return
    table = Table(show_edge=False)
    for col in ("id", "dead at", "queue", "task", "task id", "deliveries", "reason"):
        table.add_column(col)
    for d in letters:
        h = d.message.headers
        table.add_row(str(d.id), time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(d.dead_at)),
                      d.queue, str(h.get("task", "?")), str(h.get("id", "?")),
                      str(d.delivery_count), d.reason)
    # Piped output (scripts, grep) gets whole lines rather than a wrapped table.
    Console(width=None if sys.stdout.isatty() else 250).print(table)


@dead.command()
@click.argument("ids", nargs=-1, required=True)
@click.pass_obj
def show(load: AppLoader, ids: tuple[str, ...]) -> None:
    """Everything about the dead letters IDS: reason, headers, properties, body."""
    app = load()
    for d in _find(load, ids):
        m = d.message
        body = _shown(m, app.settings.max_message_size)
        click.echo(orjson.dumps({
            "id": d.id, "queue": d.queue, "reason": d.reason, "deliveries": d.delivery_count,
            "dead_at": d.dead_at, "headers": m.headers, "properties": m.properties,
            "content_type": m.content_type, "body": body,
        }, option=orjson.OPT_INDENT_2).decode())


@dead.command()
@click.argument("ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Requeue every dead letter.")
@click.pass_obj
def requeue(load: AppLoader, ids: tuple[str, ...], all_: bool) -> None:
    """Put dead letters back on their queues, as new deliveries."""
    if bool(ids) == all_:
        raise click.UsageError("give dead letter IDS or --all")
    letters = load().transport.dead_letters(LIMIT) if all_ else _find(load, ids)
    moved = load().transport.requeue_dead([d.id for d in letters])
    click.echo(f"requeued {moved} message(s)")


@dead.command()
@click.argument("ids", nargs=-1)
@click.option("-f", "--force", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def purge(load: AppLoader, ids: tuple[str, ...], force: bool) -> None:
    """Delete dead letters IDS, or all of them."""
    transport = load().transport
    if ids:
        _find(load, ids)
    count = len(ids) if ids else len(transport.dead_letters(LIMIT))
    if not force:
        click.confirm(f"Delete {count} dead letter(s)?", abort=True)
    removed = transport.purge_dead([_id(i) for i in ids] if ids else None)
    click.echo(f"deleted {removed} dead letter(s)")


def _id(value: str) -> int | str:
    return int(value) if value.isdigit() else value


def _shown(m: Message, limit: int) -> str:
    """A dead letter's body as text: JSON as it is (decompressed first if its header says
    so and it can be), anything else by its size and type."""
    body, packed = m.body, m.headers.get(compression.HEADER)
    if packed is not None:
        try:
            body = compression.decompress(body, packed, limit)
        except DecodeError as exc:
            return f"<{len(m.body)} bytes of {m.content_type}, compressed: {exc}>"
    if m.content_type.endswith("json"):
        return body.decode("utf-8", "replace")
    return f"<{len(body)} bytes of {m.content_type}>"
