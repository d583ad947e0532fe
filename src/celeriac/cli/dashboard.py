"""``celeriac dashboard``: the web dashboard and ``/metrics``, served by uvicorn."""

from __future__ import annotations

import ipaddress
import logging
from types import FrameType

import click

from .. import dashboard as _dashboard
from ..dashboard import EXTRA
from ..dashboard.security import LOOPBACK_HOSTS, parse_basic_auth
from .loader import AppLoader
from .worker import setup_logging

logger = logging.getLogger("celeriac.dashboard")

LEVELS = ("debug", "info", "warning", "error", "critical")
GRACE = 5
"""Seconds a stop waits for requests still running (a slow /api/queues) before it
cancels them."""


def is_loopback(host: str) -> bool:
    """True only for names that cannot be reached from another machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # any other name may resolve to anything


def _auth(ctx: click.Context, param: click.Parameter, value: str | None
          ) -> tuple[str, str] | None:
    if not value:
        return None
    try:
        return parse_basic_auth(value)
    except ValueError as exc:
        # never echo the value: it holds a password
        raise click.BadParameter(str(exc)) from None


def _names(value: str | None) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()] if value else []


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=5555, show_default=True)
@click.option("--basic-auth", "auth", envvar="CELERIAC_DASHBOARD_AUTH", callback=_auth,
              metavar="USER:PASSWORD",
              help="Require HTTP basic auth on every page, API and /metrics. Prefer the "
                   "CELERIAC_DASHBOARD_AUTH variable: arguments show in `ps`.")
@click.option("-Q", "--queues", default=None,
              help="Comma-separated queues to show besides the default queue and those "
                   "seen in task events.")
@click.option("--insecure-bind", is_flag=True, default=False,
              help="Listen on a non-loopback --host without --basic-auth (anyone who can "
                   "reach it sees task arguments, results and tracebacks).")
@click.option("--allowed-hosts", default=None, metavar="NAMES",
              help="Comma-separated Host header names to accept (default: the loopback "
                   "names when listening on loopback, else any). Needed behind a reverse "
                   "proxy that passes its own Host to a loopback dashboard.")
@click.option("--read-only", is_flag=True, default=False,
              help="No actions: the page shows no revoke, pool, rate-limit or shutdown "
                   "buttons and the server refuses them.")
@click.option("-l", "--loglevel", type=click.Choice(LEVELS, case_sensitive=False),
              default="info", show_default=True)
@click.pass_obj
def dashboard(load: AppLoader, host: str, port: int, auth: tuple[str, str] | None,
              queues: str | None, insecure_bind: bool, allowed_hosts: str | None,
              read_only: bool, loglevel: str) -> None:
    """Serve the web dashboard (live workers, tasks, queues, charts) and /metrics."""
    loopback = is_loopback(host)
    if not loopback and auth is None and not insecure_bind:
        raise click.ClickException(
            f"refusing to listen on {host!r} without --basic-auth: anyone who can reach it "
            "would see task arguments, results and tracebacks (use --basic-auth, or "
            "--insecure-bind if another layer protects it)")
    try:
        # Deferred: the dashboard extra (uvicorn, starlette) is optional.
        import uvicorn

        _dashboard.require_dependencies()
    except ImportError as exc:
        raise click.ClickException(f"the dashboard needs {exc.name}: {EXTRA}") from None

    setup_logging(loglevel)
    app = load()
    app.transport.ping()  # fail now, in one line, on a bad or unreachable broker
    hosts: list[str] | None = _names(allowed_hosts) or None
    if hosts is None and loopback and auth is None:
        # Without auth, loopback is the only protection; a DNS-rebinding page in the
        # user's browser would otherwise reach it under its own name.
        hosts = list(LOOPBACK_HOSTS)
    web = _dashboard.create_app(app, auth=auth, queues=_names(queues), allowed_hosts=hosts,
                                read_only=read_only)
    shown = f"[{host}]" if ":" in host else host
    logger.info("celeriac dashboard on http://%s:%d/ (%s, %s)", shown, port,
                f"basic auth as {auth[0]!r}" if auth else "no auth",
                "read-only" if read_only else "actions on")
    config = uvicorn.Config(web, host=host, port=port, log_config=None,
                            log_level=loglevel.lower(), access_log=loglevel.lower() == "debug",
                            server_header=False, lifespan="on",
                            timeout_graceful_shutdown=GRACE)
    monitor = web.state.monitor

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # uvicorn waits for open responses before shutting the app down; the
            # event streams end only when told to.
            monitor.end_streams_threadsafe()
            super().handle_exit(sig, frame)

    Server(config).run()
