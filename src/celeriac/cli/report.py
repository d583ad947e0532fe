"""``celeriac report``: what to paste into a bug report, as ``celery report`` prints it.

Nothing secret may reach the output: settings whose name looks secret (Celery's
``HIDDEN_SETTINGS``) are masked whole, at any depth of a mapping, and every string that
looks like a URL has its password masked.
"""

from __future__ import annotations

import platform

import click

from ..__about__ import __version__
from ..settings.report import installed_clients, mask_url, settings_lines
from .loader import AppLoader


@click.command()
@click.pass_obj
def report(load: AppLoader) -> None:
    """Print versions and settings (secrets masked) for a bug report."""
    app = load()
    settings = app.settings
    py = f"{platform.python_implementation()} {platform.python_version()}"
    clients = installed_clients()
    lines = [
        f"software -> celeriac:{__version__} py:{py}",
        f"platform -> system:{platform.system()} arch:{platform.machine()} "
        f"kernel version:{platform.release()}",
        f"clients  -> {' '.join(clients) if clients else '(none)'}",
        f"app      -> {app.main or '__main__'}" + (f" ({load.spec})" if load.spec else ""),
        f"broker   -> {mask_url(settings.broker_url)}",
        f"results  -> {mask_url(settings.backend_url)}",
        "",
        *settings_lines(settings),
    ]
    click.echo("\n".join(lines))
