"""``celeriac health``: is that worker's event loop turning? For liveness probes.

Exit status 0 when the worker's health file (``worker --health-file``) was touched
within ``--max-age`` seconds and the pid written in it (and in ``--pidfile``, when given)
is a live process; 1 otherwise, with the reason on stderr. Nothing goes to the broker:
a probe must not fail because the broker is slow, nor pass because the broker answers
for a wedged worker. ``--max-age`` defaults to three of the worker's
``worker_health_interval`` (read from ``-A``'s app when given; 5 s by default).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import click

from ..settings import Settings
from ..utils.nodenames import node_format, worker_hostname
from .loader import AppLoader
from .pidfile import alive, read_pid

MISSED_TICKS = 3
"""Default ``--max-age``: this many health intervals without a touch."""


class Unhealthy(Exception):
    """Why the probe fails (one line)."""


def check(path: str, max_age: float, pidfile: str | None = None,
          now: float | None = None) -> int:
    """The worker's pid if its loop is turning; raises ``Unhealthy`` with the reason."""
    try:
        mtime = os.stat(path).st_mtime
        text = Path(path).read_text().strip()
    except FileNotFoundError:
        raise Unhealthy(f"health file {path} is missing: the worker is not running, "
                        "or was started without --health-file") from None
    except OSError as exc:
        raise Unhealthy(f"cannot read health file {path}: {exc.strerror}") from None
    try:
        pid = int(text.splitlines()[0])
    except (ValueError, IndexError):
        raise Unhealthy(f"health file {path} does not hold a pid: {text[:40]!r}") from None
    if not alive(pid):
        raise Unhealthy(f"worker pid {pid} (from {path}) is not running")
    if pidfile is not None:
        other = read_pid(pidfile)
        if other is None:
            raise Unhealthy(f"pid file {pidfile} is missing")
        if other != pid:
            raise Unhealthy(f"pid file {pidfile} names {other}, the health file {pid}: "
                            "another worker's files?")
    age = (time.time() if now is None else now) - mtime
    if age > max_age:
        raise Unhealthy(f"worker {pid}: loop has not turned for {age:.0f} s "
                        f"(health file {path}, --max-age {max_age:g})")
    return pid


@click.command()
@click.option("-n", "--hostname", default=None,
              help="The worker's node name, for %n in the paths (default celeriac@%h).")
@click.option("--health-file", default="%n.health", show_default=True,
              help="The worker's --health-file.")
@click.option("--pidfile", default=None, help="The worker's --pidfile, checked too.")
@click.option("--max-age", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds since the last touch before the worker counts as stuck "
                   f"(default {MISSED_TICKS} x worker_health_interval).")
@click.pass_obj
def health(load: AppLoader, hostname: str | None, health_file: str, pidfile: str | None,
           max_age: float | None) -> None:
    """Exit 0 while the worker's event loop is turning, 1 (with the reason) if not."""
    try:
        node = worker_hostname(hostname)
        path = node_format(health_file, node)
        pidpath = node_format(pidfile, node) if pidfile else None
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if max_age is None:
        # The app only for its settings; no connection is made.
        settings = load().settings if load.spec else Settings.from_env()
        max_age = MISSED_TICKS * settings.worker_health_interval
    try:
        pid = check(path, max_age, pidpath)
    except Unhealthy as exc:
        click.echo(f"unhealthy: {exc}", err=True)
        sys.exit(1)
    click.echo(f"ok: worker {pid} ({node}) is turning its loop")
