"""``celeriac outbox``: the transactional outbox's relay and a look at its backlog.

``celeriac -A proj outbox relay [--url postgresql://...] [--batch N] [--idle S]`` drains
the outbox table (``outbox_table``) of ``outbox_url`` into the app's broker until
SIGINT/SIGTERM; any number may run beside each other and beside workers started with
``worker_outbox``. ``celeriac outbox status`` prints the rows waiting and the oldest's age.
"""

from __future__ import annotations

import signal
import time
from types import FrameType

import click

from ..errors import ConfigurationError
from ..producer import outbox as _outbox
from ..producer.outbox_relay import Relay
from .loader import AppLoader
from .worker import LEVELS, setup_logging


@click.group()
def outbox() -> None:
    """The transactional outbox (``app.transaction(conn)``): relay and status."""


@outbox.command()
@click.option("--url", default=None, metavar="URL",
              help="The PostgreSQL database holding the outbox (default: outbox_url).")
@click.option("--batch", type=click.IntRange(min=1), default=500, show_default=True,
              help="Rows published per broker round trip.")
@click.option("--idle", type=click.FloatRange(min=0, min_open=True), default=5.0,
              show_default=True,
              help="Longest sleep without a NOTIFY before looking at the table again.")
@click.option("-l", "--loglevel", type=click.Choice(LEVELS, case_sensitive=False),
              default="info", show_default=True)
@click.pass_obj
def relay(load: AppLoader, url: str | None, batch: int, idle: float, loglevel: str) -> None:
    """Publish committed outbox rows to the broker, then delete them, until stopped."""
    setup_logging(loglevel)
    app = load()
    app.finalize()
    worker = Relay(app, url, batch=batch, idle=idle)

    def stop(signum: int, frame: FrameType | None) -> None:
        worker.stop()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    click.echo(f"outbox relay ready: {app.settings.outbox_table} -> "
               f"{app.settings.broker_url.split('?')[0]}", err=True)
    worker.run()
    click.echo(f"outbox relay stopped: {worker.published} message(s) published", err=True)


@outbox.command()
@click.option("--url", default=None, metavar="URL",
              help="The PostgreSQL database holding the outbox (default: outbox_url).")
@click.pass_obj
def status(load: AppLoader, url: str | None) -> None:
    """How many messages wait in the outbox, and how old the oldest is."""
    import psycopg  # deferred: the postgres extra

    app = load()
    url = url or app.settings.outbox_url
    if not url:
        raise ConfigurationError("outbox_url is not set (or give --url)")
    table = _outbox.quoted(app.settings.outbox_table)
    with psycopg.connect(url, connect_timeout=5) as conn:
        exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()
        if not exists or not exists[0]:
            click.echo(f"{app.settings.outbox_table}: no table yet (nothing was written)")
            return
        count, oldest = conn.execute(f"SELECT count(*), min(created) FROM {table}").fetchone() \
            or (0, None)
    age = f", oldest {time.time() - oldest:.1f}s old" if oldest is not None else ""
    click.echo(f"{app.settings.outbox_table}: {count} message(s) waiting{age}")
