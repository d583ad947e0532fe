"""``celeriac worker``."""

from __future__ import annotations

import logging
import sys

import click

from ..worker import Worker
from ..worker.pool import POOLS
from .loader import AppLoader

LEVELS = ("debug", "info", "warning", "error", "critical")


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), stream=sys.stderr,
        format="[%(asctime)s: %(levelname)s/%(processName)s] %(name)s: %(message)s",
    )


@click.command()
@click.option("-c", "--concurrency", type=click.IntRange(min=1), default=None,
              help="Pool size (default: number of CPUs; 1 for solo).")
@click.option("-Q", "--queues", default=None, help="Comma-separated queues to consume.")
@click.option("-l", "--loglevel", type=click.Choice(LEVELS, case_sensitive=False),
              default="warning", show_default=True)
@click.option("-n", "--hostname", default=None, help="Node name (default celeriac@host).")
@click.option("-P", "--pool", type=click.Choice(sorted(POOLS)), default=None,
              help="Execution pool (default: worker_pool setting).")
@click.pass_obj
def worker(load: AppLoader, concurrency: int | None, queues: str | None, loglevel: str,
           hostname: str | None, pool: str | None) -> None:
    """Start a worker that executes tasks."""
    setup_logging(loglevel)
    app = load()
    app.transport.ping()  # fail now, in one line, on a bad or unreachable broker
    queue_list = [q.strip() for q in queues.split(",") if q.strip()] if queues else None
    w = Worker(app, hostname=hostname, concurrency=concurrency, queues=queue_list, pool=pool)
    sys.exit(w.run())
