"""``celeriac events``: watch the events workers send (top, dump, or a camera)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

import click
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..app import Celeriac
from ..clients.net import mask_password
from ..events import ClusterState, Event, EventReceiver, JSONLinesCamera
from ..events.cameras import Camera, load_camera
from ..events.state import describe_progress
from .loader import AppLoader
from .worker import LEVELS, setup_logging

REFRESH = 0.5  # seconds between redraws of the top view
COMMON = frozenset({"type", "hostname", "pid", "utcoffset", "timestamp", "clock",
                    "local_received", "uuid", "name"})
SHORT = {"args": 60, "kwargs": 60, "result": 60}
STATE_STYLE = {"SUCCESS": "green", "FAILURE": "red", "RETRY": "yellow", "REVOKED": "magenta",
               "REJECTED": "magenta", "STARTED": "cyan", "RECEIVED": "blue"}


@click.command()
@click.option("-d", "--dump", is_flag=True, help="Print one line per event as it arrives.")
@click.option("-c", "--camera", metavar="MODULE.CLASS",
              help="Hand snapshots of the cluster state to this Camera subclass, e.g. "
                   "celeriac.events.JSONLinesCamera.")
@click.option("-F", "--frequency", "--freq", type=click.FloatRange(min=0, min_open=True),
              default=1.0, show_default=True, help="Seconds between camera shots.")
@click.option("--camera-output", metavar="PATH",
              help="JSONLinesCamera: the file to append snapshots to (default: stdout).")
@click.option("--limit", type=click.IntRange(min=1), help="Stop after this many events.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True),
              help="Stop after this many seconds.")
@click.option("-l", "--loglevel", type=click.Choice(LEVELS, case_sensitive=False),
              default="warning", show_default=True)
@click.pass_obj
def events(load: AppLoader, dump: bool, camera: str | None, frequency: float,
           camera_output: str | None, limit: int | None, timeout: float | None,
           loglevel: str) -> None:
    """Watch events: a live view of workers and tasks (quit with q or Ctrl-C), or one
    line per event (--dump), or periodic snapshots (--camera).

    The live view needs a terminal: when stdout is not one, events are printed one per
    line, as with --dump. Workers send task events with worker_send_task_events (-E).
    """
    setup_logging(loglevel)
    if dump and camera:
        raise click.UsageError("--dump and --camera do not go together")
    if camera_output is not None and not camera:
        raise click.UsageError("--camera-output needs --camera")
    app = load()
    watch = Watch(app, limit, timeout)
    if camera:
        try:
            cls = load_camera(camera)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--camera") from None
        options: dict[str, Any] = {}
        if camera_output is not None:
            if not issubclass(cls, JSONLinesCamera):
                raise click.UsageError("--camera-output is for JSONLinesCamera and its "
                                       "subclasses")
            options["output"] = camera_output
        asyncio.run(watch.camera(cls(watch.state, frequency, **options)))
    elif dump or not sys.stdout.isatty():
        if not dump:
            click.echo("stdout is not a terminal: printing one line per event (--dump)",
                       err=True)
        asyncio.run(watch.dump(sys.stdout))
    else:
        asyncio.run(watch.top(Console()))


class Watch:
    """One run of the command: a receiver feeding a ClusterState until the limit, the
    timeout, q, Ctrl-C or SIGTERM."""

    def __init__(self, app: Celeriac, limit: int | None, timeout: float | None) -> None:
        self.app = app
        self.limit = limit
        self.timeout = timeout
        self.state = ClusterState()
        self.count = 0
        self.stop = asyncio.Event()

    async def run(self, on_event: Callable[[Event], None], announce: bool = True) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self.stop.set)

        def handle(event: Event) -> None:
            self.count += 1
            self.state.event(event)
            on_event(event)

        receiver = EventReceiver(self.app, {"*": handle})
        async with receiver:
            if announce:  # tests and scripts wait for this line before they send
                where = mask_password(self.app.settings.broker_url.split(";")[0])
                click.echo(f"celeriac events: listening on {where}", err=True)
            capture = asyncio.create_task(receiver.acapture(self.limit, self.timeout))
            stopped = asyncio.create_task(self.stop.wait())
            try:
                await asyncio.wait({capture, stopped}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (capture, stopped):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    async def dump(self, out: TextIO) -> None:
        def write(event: Event) -> None:
            task = self.state.tasks.get(event.get("uuid", ""))
            try:
                out.write(format_event(event, task.name if task else None) + "\n")
                out.flush()
            except BrokenPipeError:  # `celeriac events --dump | head`
                self.stop.set()
                os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())

        await self.run(write)

    async def camera(self, camera: Camera) -> None:
        shutter = asyncio.Event()
        shots = asyncio.create_task(camera.arun(shutter))
        try:
            await self.run(lambda event: None)
        finally:
            shutter.set()
            await shots  # the last shot and cleanup

    async def top(self, console: Console) -> None:
        async def redraw(live: Live) -> None:
            while True:
                live.update(render(self.state, console.size.height), refresh=True)
                await asyncio.sleep(REFRESH)

        with _keys(self.stop), Live(render(self.state, console.size.height), console=console,
                                    screen=True, auto_refresh=False) as live:
            # Redrawn from the loop's thread: rich's refresh thread would read the state
            # while a handler changes it.
            painter = asyncio.create_task(redraw(live))
            try:
                await self.run(lambda event: None, announce=False)
            finally:
                painter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await painter


@contextlib.contextmanager
def _keys(stop: asyncio.Event) -> Iterator[None]:
    """Read single keys from a terminal's stdin (cbreak: no Enter needed, Ctrl-C still a
    signal); q quits. The terminal's settings are restored whatever happens."""
    if not sys.stdin.isatty():
        yield
        return
    import termios  # deferred: Unix only
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    loop = asyncio.get_running_loop()

    def on_key() -> None:
        if os.read(fd, 64).lower().find(b"q") >= 0:
            stop.set()

    tty.setcbreak(fd)
    loop.add_reader(fd, on_key)
    try:
        yield
    finally:
        loop.remove_reader(fd)
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def format_event(event: Event, name: str | None = None) -> str:
    """``2024-05-01 12:00:00.123 host type [uuid name] key=value ...`` on one line."""
    ts = event.get("timestamp")
    when = (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) + f".{int(ts % 1 * 1000):03d}"
            if isinstance(ts, int | float) else "-")
    parts = [when, str(event.get("hostname", "?")), str(event.get("type", "?"))]
    if "uuid" in event:
        parts.append(str(event["uuid"]))
        name = event.get("name") or name
        if name:
            parts.append(str(name))
    for key, value in event.items():
        if key not in COMMON:
            parts.append(f"{key}={_short(value, SHORT.get(key, 120))}")
    return " ".join(parts)


def _short(value: object, width: int) -> str:
    text = value if isinstance(value, str) else repr(value)
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[:width - 3] + "..."


def progress_cell(meta: Any, width: int = 10) -> Text:
    """A task's progress for the live view: ``40/100`` with a bar when the meta says
    how far along it is (``events.state.describe_progress``), else its short text."""
    text, ratio = describe_progress(meta)
    if ratio is None:
        return Text(text)
    filled = round(ratio * width)
    return Text.assemble(("\u2588" * filled, "green"), ("\u2591" * (width - filled), "dim"),
                         " " + text)


def render(state: ClusterState, height: int) -> RenderableType:
    now = state.clock()
    per_s, _ = state.throughput()
    head = Text.assemble(("celeriac events", "bold"), f"  {state.event_count} events, "
                         f"{state.task_count} tasks, {per_s:.1f} tasks/s   ", ("q: quit", "dim"))
    if state.beat_leader or state.beat_sent:
        last = max(state.beat_sent.values(), key=lambda e: e.get("timestamp") or 0,
                   default=None)
        head.append(f"\nbeat: {state.beat_leader or 'no leader heard'} leads; "
                    f"{len(state.beat_sent)} entries sent" +
                    (f", last {last.get('entry')} (due {last.get('due')})" if last else ""))
    workers = Table(expand=True, title="workers", title_justify="left")
    for col in ("worker", "status", "active", "processed", "load", "heard from"):
        workers.add_column(col, justify="right" if col in ("active", "processed") else "left")
    for w in sorted(state.workers.values(), key=lambda w: w.hostname):
        seen = f"{now - w.last_heartbeat:.0f}s ago" if w.last_heartbeat else "-"
        workers.add_row(w.hostname, Text(w.status, "green" if w.alive else "red"),
                        str(w.active), str(w.processed),
                        " ".join(f"{x:.2f}" for x in w.loadavg), seen)
    tasks = Table(expand=True, title="latest tasks", title_justify="left")
    for col in ("uuid", "name", "state", "progress", "worker", "runtime"):
        tasks.add_column(col, justify="right" if col == "runtime" else "left")
    rows = max(height - len(state.workers) - 12, 3)
    for t in itertools.islice(reversed(state.tasks.values()), rows):
        tasks.add_row(t.uuid, t.name or "?", Text(t.state, STATE_STYLE.get(t.state, "")),
                      progress_cell(t.progress), t.worker or "-",
                      f"{t.runtime:.3f}s" if t.runtime is not None else "")
    return Group(head, workers, tasks)
