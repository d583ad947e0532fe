"""``celeriac worker``."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

import click

from .. import signals
from ..errors import ConfigurationError
from ..utils.nodenames import node_format, worker_hostname
from ..worker import Worker
from ..worker.pool import POOLS
from .loader import AppLoader
from .pidfile import Pidfile

if TYPE_CHECKING:
    from ..app import Celeriac

LEVELS = ("debug", "info", "warning", "error", "critical")


FORMAT = "[%(asctime)s: %(levelname)s/%(processName)s] %(name)s: %(message)s"


def setup_logging(level: str, logfile: str | None = None) -> None:
    """Log to stderr, or to ``logfile``: opened for appending, so that the prefork
    children, which inherit the handler, and a restarted worker add to it."""
    if logfile is None:
        logging.basicConfig(level=level.upper(), stream=sys.stderr, format=FORMAT)
        return
    try:
        handler = logging.FileHandler(logfile, mode="a", encoding="utf-8")
    except OSError as exc:
        raise click.ClickException(f"cannot open log file {logfile}: {exc.strerror}") from None
    logging.basicConfig(level=level.upper(), handlers=[handler], format=FORMAT)


def _hostname(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    try:
        return worker_hostname(value)
    except ValueError as exc:
        raise click.BadParameter(f"{exc} in {value!r}") from None


def expand(template: str | None, node: str, param: str) -> str | None:
    """``--logfile``/``--pidfile`` expanded for this node, in the main process."""
    if template is None:
        return None
    try:
        return node_format(template, node)
    except ValueError as exc:
        raise click.BadParameter(f"{exc} in {template!r}", param_hint=param) from None


def _autoscale(ctx: click.Context, param: click.Parameter, value: str | None
               ) -> tuple[int, int] | None:
    if value is None:
        return None
    try:
        high, low = (int(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter("expected MAX,MIN, e.g. 8,2") from None
    if not 1 <= low <= high:
        raise click.BadParameter("expected 1 <= MIN <= MAX")
    return high, low


@click.command()
@click.option("-c", "--concurrency", type=click.IntRange(min=1), default=None,
              help="Pool size (default: number of CPUs; 1 for solo).")
@click.option("-Q", "--queues", default=None,
              help="Comma-separated queues to consume (default: task_queues, else the "
                   "default queue).")
@click.option("-X", "--exclude-queues", default=None,
              help="Comma-separated queues not to consume, of those -Q or task_queues give.")
@click.option("-l", "--loglevel", type=click.Choice(LEVELS, case_sensitive=False),
              default="warning", show_default=True)
@click.option("-n", "--hostname", default=None, callback=_hostname,
              help="Node name, e.g. w1@%h (default celeriac@%h).")
@click.option("-f", "--logfile", default=None,
              help="Log to this file instead of stderr, e.g. %n.log.")
@click.option("--pidfile", default=None,
              help="Write the pid here, e.g. %n.pid; refuse to start if it names a "
                   "running process.")
@click.option("--health-file", default=None,
              help="Touch this file every worker_health_interval seconds while the "
                   "worker's loop turns (for `celeriac health`), e.g. %n.health.")
@click.option("--without-gossip", is_flag=True, default=False,
              help="Do not follow other workers (no live set, no elections).")
@click.option("-P", "--pool", type=click.Choice(sorted(POOLS)), default=None,
              help="Execution pool (default: worker_pool setting, prefork).")
@click.option("--autoscale", callback=_autoscale, default=None, metavar="MAX,MIN",
              help="Grow the prefork pool up to MAX with backlog, shrink to MIN when idle.")
@click.option("--max-tasks-per-child", type=click.IntRange(min=1), default=None)
@click.option("--max-memory-per-child", type=click.IntRange(min=1), default=None,
              metavar="KIB", help="Recycle a child after a task once its RSS exceeds this.")
@click.option("--child-concurrency", type=click.IntRange(min=1), default=None, metavar="N",
              help="async def tasks a prefork child (or the threads pool's loop) runs at "
                   "once (default: worker_child_concurrency, 100).")
@click.option("--time-limit", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Hard time limit in seconds for every task.")
@click.option("--soft-time-limit", type=click.FloatRange(min=0, min_open=True), default=None)
@click.option("-E", "--task-events", is_flag=True, default=None,
              help="Send task events (for `celeriac events` and the dashboard).")
@click.option("-B", "--beat", is_flag=True, default=False,
              help="Also run a beat (periodic tasks) in this worker.")
@click.option("--without-heartbeat", is_flag=True, default=False,
              help="Send no worker-online/-heartbeat/-offline events.")
@click.option("-S", "--statedb", default=None,
              help="Keep revoked task ids in this file across restarts, e.g. %n.state.")
@click.option("--without-mingle", is_flag=True, default=False,
              help="Do not ask peers for their revoked ids at startup.")
@click.pass_obj
def worker(load: AppLoader, concurrency: int | None, queues: str | None,
           exclude_queues: str | None, loglevel: str,
           hostname: str, logfile: str | None, pidfile: str | None, pool: str | None,
           autoscale: tuple[int, int] | None,
           max_tasks_per_child: int | None, max_memory_per_child: int | None,
           child_concurrency: int | None,
           time_limit: float | None, soft_time_limit: float | None,
           task_events: bool | None, beat: bool, without_heartbeat: bool,
           statedb: str | None, without_mingle: bool,
           health_file: str | None = None, without_gossip: bool = False) -> None:
    """Start a worker that executes tasks.

    In -n, --logfile and --pidfile: %h host name, %n name (w1 of w1@host), %d domain,
    %p node name, %i/%I process index (0/empty), %% a percent sign.
    """
    logpath = expand(logfile, hostname, "--logfile")
    lock = Pidfile(path) if (path := expand(pidfile, hostname, "--pidfile")) else None
    if lock is not None:
        lock.check()  # before connecting anywhere: a second worker fails fast
    try:
        app = load()
        # After the app is loaded, so that its setup_logging receivers are connected.
        _start_logging(loglevel, logpath)
        overrides: dict[str, Any] = {
            "worker_max_tasks_per_child": max_tasks_per_child,
            "worker_max_memory_per_child": max_memory_per_child,
            "worker_child_concurrency": child_concurrency,
            "task_time_limit": time_limit, "task_soft_time_limit": soft_time_limit,
        }
        app.settings = app.settings.replace(
            **{k: v for k, v in overrides.items() if v is not None})
        app.transport.ping()  # fail now, in one line, on a bad or unreachable broker
        if lock is not None:
            # Written once the broker answers: `celeriac multi start` takes the file for
            # "started".
            lock.acquire()
        queue_list = _queues(app, queues, exclude_queues)
        w = Worker(app, hostname=hostname, concurrency=concurrency, queues=queue_list,
                   pool=pool, autoscale=autoscale, task_events=task_events or None,
                   heartbeat=False if without_heartbeat else None, beat=beat,
                   gossip=not without_gossip,
                   health_file=expand(health_file, hostname, "--health-file"),
                   statedb=expand(statedb, hostname, "--statedb"),
                   mingle=not without_mingle)
        code = w.run()
    finally:
        if lock is not None:
            lock.release()
    sys.exit(code)


def _start_logging(loglevel: str, logpath: str | None) -> None:
    """Logging set up, and Celery's logging signals sent: a ``setup_logging`` receiver
    configures logging itself (Celery's rule), else we do."""
    if not signals.setup_logging.receivers:
        setup_logging(loglevel, logpath)
    signals.setup_logging.send(sender=None, loglevel=loglevel.upper(), logfile=logpath,
                               format=FORMAT, colorize=False)
    signals.after_setup_logger.send(sender=None, logger=logging.getLogger(),
                                    loglevel=loglevel.upper(), logfile=logpath,
                                    format=FORMAT, colorize=False)


def _queues(app: Celeriac, queues: str | None, exclude_queues: str | None) -> list[str]:
    """The queues to consume: ``-Q`` (else the app's), each checked against
    ``task_queues``, less ``-X``."""
    queue_list = _names(queues) or app.default_queues
    try:
        for queue in queue_list:
            app.routing.check(queue)
    except ConfigurationError as exc:
        raise click.UsageError(f"-Q {queues}: {exc}") from None
    if exclude_queues:
        excluded = set(_names(exclude_queues))
        queue_list = [q for q in queue_list if q not in excluded]
        if not queue_list:
            raise click.UsageError(f"-X {exclude_queues} leaves no queue to consume")
    return queue_list


def _names(option: str | None) -> list[str]:
    """A comma-separated option as a list of names."""
    return [q.strip() for q in option.split(",") if q.strip()] if option else []
