"""``celeriac multi``: start and stop several detached workers, as ``celery multi`` does.

``celeriac -A proj multi start w1 w2 -c 2`` starts ``celeriac worker -n w1@<host>
--pidfile w1.pid --logfile w1%I.log -c 2`` (and w2) detached from the terminal; ``stop``
signals the pids in the pid files, ``stopwait`` also waits for the workers to exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Sequence

import click

from ..utils.nodenames import NODENAME_DEFAULT, node_format, worker_hostname
from .pidfile import alive, read_pid
from .worker import worker

ACTIONS = ("start", "stop", "stopwait", "restart", "kill", "show", "names")
DEFAULT_PIDFILE = "%n.pid"
DEFAULT_LOGFILE = "%n%I.log"
POLL = 0.05
# Kept literal for the worker to expand in each process (its own %i, and %% as %).
_FOR_WORKER = {"i": "%i", "I": "%I", "%": "%%"}


@dataclasses.dataclass
class Options:
    names: list[str] = dataclasses.field(default_factory=list)
    app: str | None = None
    pidfile: str = DEFAULT_PIDFILE
    logfile: str = DEFAULT_LOGFILE
    timeout: float = 60.0
    worker_args: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Node:
    name: str
    pidfile: str
    """For this process to read: fully expanded."""
    logfile: str
    argv: list[str]


def _worker_options() -> dict[str, bool]:
    """Every worker option, and whether it takes a value: so that in ``-c 2 w3`` the
    ``2`` is known to be a value and ``w3`` a node name."""
    known: dict[str, bool] = {}
    for param in worker.params:
        if isinstance(param, click.Option):
            for opt in (*param.opts, *param.secondary_opts):
                known[opt] = not (param.is_flag or param.count)
    return known


# multi's own options (not passed to the workers): option -> Options field.
_OWN = {"-A": "app", "--app": "app", "--pidfile": "pidfile", "-f": "logfile",
        "--logfile": "logfile", "--timeout": "timeout"}


def parse(args: Sequence[str]) -> Options:
    """Node names and options in any order, as ``celery multi`` takes them."""
    opts = Options()
    takes_value: dict[str, bool] = {**_worker_options(), **dict.fromkeys(_OWN, True)}
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg == "--":
            opts.worker_args += rest
            break
        if not arg.startswith("-") or arg == "-":
            opts.names.append(arg)
            continue
        name, value = _option(arg, rest, takes_value)
        if value is None:  # a flag
            opts.worker_args.append(name)
        elif name in _OWN:
            _set_own(opts, _OWN[name], name, value)
        else:
            opts.worker_args += [name, value]
    if len(opts.names) == 1 and opts.names[0].isdigit():
        # `multi start 3`: celeriac1, celeriac2, celeriac3 (Celery's celery1...).
        opts.names = [f"{NODENAME_DEFAULT}{i}" for i in range(1, int(opts.names[0]) + 1)]
    return opts


def _option(arg: str, rest: list[str], takes_value: dict[str, bool]
            ) -> tuple[str, str | None]:
    """The option ``arg`` names and its value (None for a flag), from ``arg`` itself
    (``--x=v``, ``-xv``) or else taken from the head of ``rest``."""
    name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
    if not arg.startswith("--") and len(arg) > 2:  # -c2, -Aproj
        name, eq, value = arg[:2], "=", arg[2:]
    if name in ("-n", "--hostname"):
        raise click.UsageError("node names are the NAME arguments (w1 is w1@%h), "
                               "not -n")
    wants = takes_value.get(name)
    if wants is None:
        raise click.UsageError(f"no such worker option: {name}")
    if eq and not wants:
        raise click.UsageError(f"option {name} takes no value: {arg}")
    if not wants:
        return name, None
    if not eq:
        if not rest:
            raise click.UsageError(f"option {name} needs a value")
        value = rest.pop(0)
    return name, value


def _set_own(opts: Options, field: str, name: str, value: str) -> None:
    if field == "timeout":
        try:
            opts.timeout = float(value)
        except ValueError:
            raise click.UsageError(f"{name} expects seconds, got {value!r}") from None
    else:
        setattr(opts, field, value)


def nodes(opts: Options) -> list[Node]:
    result = []
    for name in opts.names:
        try:
            node = worker_hostname(name if "@" in name else f"{name}@%h")
            pidfile = node_format(opts.pidfile, node)
            logfile = node_format(opts.logfile, node)
            argv = [sys.executable, "-m", "celeriac", *(["-A", opts.app] if opts.app else []),
                    "worker", "-n", node,
                    "--pidfile", node_format(opts.pidfile, node, extra=_FOR_WORKER),
                    "--logfile", node_format(opts.logfile, node, extra=_FOR_WORKER),
                    *opts.worker_args]
        except ValueError as exc:
            raise click.UsageError(f"{exc} in node {name!r}, --pidfile or --logfile"
                                   ) from None
        result.append(Node(node, pidfile, logfile, argv))
    return result


def spawn_detached(argv: Sequence[str], output: str) -> int:
    """Start ``argv`` in a session of its own with stdin from /dev/null and stdout and
    stderr appended to ``output`` (what it says before its logging is set up, a one-line
    error say, is found there). Forked rather than ``Popen``-ed: this process exits
    while the worker runs, and must leave no child object behind that it never waited
    for."""
    try:
        out = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as exc:
        raise click.ClickException(f"cannot open log file {output}: {exc.strerror}") from None
    devnull = os.open(os.devnull, os.O_RDONLY)
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - replaced by exec
            try:
                os.setsid()  # no controlling terminal: the shell's Ctrl-C or hangup
                os.dup2(devnull, 0)
                os.dup2(out, 1)
                os.dup2(out, 2)
                # Python ignores SIGPIPE and an exec keeps that; a worker starts clean.
                signal.signal(signal.SIGPIPE, signal.SIG_DFL)
                os.execv(argv[0], list(argv))
            finally:
                os._exit(127)
        return pid
    finally:
        os.close(devnull)
        os.close(out)


def _exit_status(pid: int) -> int | None:
    """The exit status of our child ``pid`` if it has exited, else ``None``."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return os.waitstatus_to_exitcode(status) if done else None


def _poll(deadline: float, pending: Callable[[], bool]) -> None:
    while pending() and time.monotonic() < deadline:
        time.sleep(POLL)


def start(all_nodes: list[Node], timeout: float) -> bool:
    click.echo("> Starting nodes...")
    started: dict[str, int] = {}
    ok = True
    for node in all_nodes:
        pid = read_pid(node.pidfile)
        if pid and alive(pid):
            click.echo(f"\t> {node.name}: already running (pid {pid})")
            continue
        started[node.name] = spawn_detached(node.argv, node.logfile)
    waiting = {n.name: n for n in all_nodes if n.name in started}
    deadline = time.monotonic() + timeout

    def pending() -> bool:
        nonlocal ok
        for name, node in list(waiting.items()):
            pid = started[name]
            code = _exit_status(pid)
            if code is not None:
                click.echo(f"\t> {name}: FAILED (exit status {code}; see {node.logfile})")
                ok = False
            elif read_pid(node.pidfile) == pid:
                click.echo(f"\t> {name}: OK (pid {pid})")
            else:
                continue
            del waiting[name]
        return bool(waiting)

    _poll(deadline, pending)
    for name, node in waiting.items():
        click.echo(f"\t> {name}: not ready within {timeout:g}s (pid {started[name]}; "
                   f"see {node.logfile})")
        ok = False
    return ok


def send(all_nodes: list[Node], signum: signal.Signals) -> dict[str, int]:
    """Signal each node's pid; the pids signalled, by node name."""
    signalled = {}
    for node in all_nodes:
        pid = read_pid(node.pidfile)
        if not pid or not alive(pid):
            if pid is not None:  # stale: its worker died without removing it
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(node.pidfile)
            click.echo(f"\t> {node.name}: DOWN")
            continue
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            click.echo(f"\t> {node.name}: DOWN")
            continue
        click.echo(f"\t> {node.name}: {signum.name.removeprefix('SIG')} -> {pid}")
        signalled[node.name] = pid
    return signalled


def wait_down(signalled: dict[str, int], timeout: float) -> bool:
    if not signalled:
        return True
    click.echo(f"> Waiting for {len(signalled)} node(s) -> "
               f"{', '.join(map(str, signalled.values()))}...")
    waiting = dict(signalled)

    def pending() -> bool:
        for name, pid in list(waiting.items()):
            if not alive(pid):
                click.echo(f"\t> {name}: OK")
                del waiting[name]
        return bool(waiting)

    _poll(time.monotonic() + timeout, pending)
    for name, pid in waiting.items():
        click.echo(f"\t> {name}: still running after {timeout:g}s (pid {pid})")
    return not waiting


def stop(all_nodes: list[Node], timeout: float, wait: bool) -> bool:
    click.echo("> Stopping nodes...")
    signalled = send(all_nodes, signal.SIGTERM)
    return wait_down(signalled, timeout) if wait else True


def kill(all_nodes: list[Node]) -> bool:
    click.echo("> Killing nodes...")
    for name, pid in send(all_nodes, signal.SIGKILL).items():
        node = next(n for n in all_nodes if n.name == name)
        # A killed worker cannot remove its pid file; leaving it would only make the
        # next start find it stale.
        if read_pid(node.pidfile) == pid:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(node.pidfile)
    return True


@click.command(context_settings={"ignore_unknown_options": True,
                                 "allow_interspersed_args": False})
@click.argument("action", type=click.Choice(ACTIONS), metavar="ACTION")
@click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="NAME... [OPTIONS]")
@click.pass_context
def multi(ctx: click.Context, action: str, args: tuple[str, ...]) -> None:
    """Start, stop or restart several detached workers.

    ACTION is start, stop, stopwait, restart, kill, show (the commands) or names.

    \b
    celeriac -A proj multi start w1 w2 -c 2 -l info
    celeriac -A proj multi stopwait w1 w2
    celeriac -A proj multi show 3          # celeriac1..3

    A NAME without @ is NAME@%h. Options of multi itself: --pidfile (default %n.pid),
    --logfile (default %n%I.log), both in the current directory unless a path is given;
    --timeout SECONDS (default 60): how long start waits for the workers to be up, and
    stopwait and restart for them to exit. Every other option goes to each worker.
    """
    if "--help" in args:  # after ACTION every word is ours to parse, --help too
        click.echo(ctx.get_help())
        ctx.exit()
    opts = parse(args)
    if opts.app is None:
        opts.app = getattr(ctx.obj, "spec", None)
    if not opts.names:
        raise click.UsageError("give at least one node name, e.g. multi start w1 w2")
    all_nodes = nodes(opts)
    if action == "names":
        click.echo("\n".join(n.name for n in all_nodes))
        return
    if action == "show":
        click.echo("\n".join(shlex.join(n.argv) for n in all_nodes))
        return
    if action == "start":
        ok = start(all_nodes, opts.timeout)
    elif action in ("stop", "stopwait"):
        ok = stop(all_nodes, opts.timeout, wait=action == "stopwait")
    elif action == "restart":
        ok = stop(all_nodes, opts.timeout, wait=True) and start(all_nodes, opts.timeout)
    else:
        ok = kill(all_nodes)
    if not ok:
        ctx.exit(1)
