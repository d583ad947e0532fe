"""The parent's record of one pool child (``ChildProc``) and how a child is forked.

Each child has three pipes: jobs (parent -> child; JOB and STOP frames), control (parent
-> child; RECALL and CANCEL frames, read by the child's control thread, see
``channels.py``) and results (child -> parent; UP, DONE, RECALLED, PROGRESS and relay
frames). The parent's ends are non-blocking and live on the event loop.
"""

from __future__ import annotations

import asyncio
import os
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..execute import Job
from ..timer import Entry
from . import pipes


@dataclass(eq=False)
class ChildProc:
    pid: int
    writer: pipes.FrameWriter
    """The job pipe."""
    control: pipes.FrameWriter
    result_fd: int
    born: float
    reader: pipes.FrameReader = field(default_factory=pipes.FrameReader)
    up: bool = False
    job: Job | None = None
    """The job it runs now."""
    started: float = 0.0
    """When ``job`` started (loop time)."""
    tasks: dict[int, Job] = field(default_factory=dict)
    """The async jobs it runs on its loop, by seq (async mode: ``job`` is None then)."""
    limits: dict[int, Entry] = field(default_factory=dict)
    """The parent's kill timers of those async jobs (hard limit + grace), by seq."""
    began: dict[int, float] = field(default_factory=dict)
    """When each of those async jobs started (loop time), by seq."""
    revoking: dict[int, Entry] = field(default_factory=dict)
    """Async jobs revoked with terminate whose CANCEL went out, by seq: the kill timer
    that fires if one is still running ``worker_async_kill_grace`` later."""
    queued: Job | None = None
    """The job waiting in its pipe behind ``job`` or ``tasks`` (the lookahead), if any."""
    queued_async: bool = False
    """``queued`` is an async job: it starts when ``tasks`` has room (a sync one, when
    ``tasks`` is empty)."""
    queued_hard: float | None = None
    """``queued``'s hard time limit, chosen when it was submitted; armed when it starts."""
    recalling: bool = False
    """A RECALL of ``queued`` is on its way. The child answers RECALLED (taken back)
    or STARTED (too late). If the DONE of ``job`` comes first, ``queued`` is in limbo
    (``job`` None, ``queued`` set) until one of those, or its own DONE, says which."""
    hard_limit: Entry | None = None
    retiring: bool = False
    """Takes no new job; it exits after what it holds (recycled, shrunk, stopping)."""
    killed_for: str | None = None
    revoked: Job | None = None
    """The job a revoke with terminate killed it for (its outcome is REVOKED)."""
    detached: bool = False
    """Its pipes are closed. Their descriptor numbers may already belong to a newer
    child's pipes, so nothing may touch them again (not even to close them)."""

    def parent_fds(self) -> list[int]:
        return [] if self.detached else [self.writer.fd, self.control.fd, self.result_fd]


def fork_child(loop: asyncio.AbstractEventLoop, siblings: Iterable[ChildProc],
               run: Callable[[int, int, int, list[int]], int]) -> ChildProc:
    """Fork a child that calls ``run(job_r, control_r, result_w, parent_fds)`` and exits
    with what it returns; the parent gets its ``ChildProc``."""
    job_r, job_w = os.pipe()
    control_r, control_w = os.pipe()
    result_r, result_w = os.pipe()
    # The child closes every parent-side end, its siblings' included: otherwise a
    # sibling would hold our pipes open and EOF would never tell us a child died.
    # A detached child's numbers are skipped: os.pipe() may just have handed them to
    # this child's own ends, which the child would then close (seen as EBADF at UP).
    parent_fds = [job_w, control_w, result_r]
    for c in siblings:
        parent_fds += c.parent_fds()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child, measured by the fault tests
        code = 1
        try:
            code = run(job_r, control_r, result_w, parent_fds)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    for fd in (job_r, control_r, result_w):
        os.close(fd)
    for fd in (job_w, control_w, result_r):
        os.set_blocking(fd, False)
    return ChildProc(pid, pipes.FrameWriter(loop, job_w), pipes.FrameWriter(loop, control_w),
                     result_r, loop.time())
