"""``--pidfile``: one worker per pid file, as Celery's ``create_pidlock`` has it.

A file naming a live process means a worker already runs: refuse to start. A file naming
a dead process (the worker was killed) is stale: replace it. The file is created with
``O_EXCL``, so two workers started at once cannot both think they hold it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import click


def read_pid(path: str | os.PathLike[str]) -> int | None:
    """The pid in the file; ``None`` if there is no file. Garbage is a one-line error."""
    try:
        text = Path(path).read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise click.ClickException(f"cannot read pid file {os.fspath(path)}: "
                                   f"{exc.strerror}") from None
    try:
        return int(text.splitlines()[0]) if text else 0
    except ValueError:
        # Not ours to judge further: a file we cannot parse was not written by a worker.
        raise click.ClickException(f"pid file {os.fspath(path)} does not hold a pid: "
                                   f"{text[:40]!r}") from None


def alive(pid: int) -> bool:
    """Whether ``pid`` runs. A zombie does not: a detached worker's parent is init, and
    in a container init may never reap it."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process, but alive
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (macOS): kill(0) is all we know
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


class Pidfile:
    def __init__(self, path: str) -> None:
        self.path = path
        self.held = False

    def check(self) -> None:
        """Refuse now (before connecting anywhere) if a live process holds the file;
        remove a stale one."""
        pid = read_pid(self.path)
        if pid is None:
            return
        # Our own pid is stale too: after a container restart a worker is often pid 1 again.
        if pid != os.getpid() and alive(pid):
            raise click.ClickException(
                f"pid file {self.path} names running process {pid}: is a worker already "
                "running? Stop it, or use another --pidfile")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def acquire(self) -> None:
        """Write our pid; a file created by another worker meanwhile is checked again."""
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                self.check()
                continue
            except OSError as exc:
                raise click.ClickException(f"cannot create pid file {self.path}: "
                                           f"{exc.strerror}") from None
            with os.fdopen(fd, "w") as f:
                f.write(f"{os.getpid()}\n")
            self.held = True
            return
        raise click.ClickException(f"cannot create pid file {self.path}: it keeps "
                                   "reappearing")

    def release(self) -> None:
        """Remove the file, if it still names us (a forked child must never remove it)."""
        if not self.held:
            return
        self.held = False
        # At exit nothing is left to tell about a file someone else removed or broke.
        with contextlib.suppress(click.ClickException, OSError):
            if read_pid(self.path) == os.getpid():
                os.unlink(self.path)
