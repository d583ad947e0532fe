"""A pool child's ends of its pipes: the ``Inbox`` it takes jobs from and the ``Outbox``
every frame it sends goes through.

The parent keeps a child's next job in the child's job pipe while the child runs the
current one (a lookahead of one job), so that a child never waits for the parent between
two tasks. That must not let a long task hold a short one back while another child is
idle: the parent then asks for the waiting job back with a RECALL frame on the child's
control pipe. The child's main thread is busy with the long task, so a control thread
answers: it takes the frames waiting in the job pipe into ``Inbox.pending`` (under the
lock that the main thread takes to read a job, so that the two never read the pipe at the
same time), removes the recalled job and answers RECALLED. If the main thread took the
job first, it answers STARTED. Either answer follows, in the result pipe, the DONE of the
job before (the main thread writes that DONE before it takes the next job), so the
parent always knows which.

The control thread also takes CANCEL (a revoke with terminate of an async job): it
records the job's seq in ``Inbox.cancelled`` and, while the child's loop runs
(``on_cancel``), has the loop cancel that job's asyncio task; a job the loop has not
started yet is cancelled as it starts (``aio.TaskSet``). It takes no lock for that: the
main thread may sit in its read of the job pipe, holding the lock, and a set's add is
atomic.

The main thread's cost per job is one uncontended lock; the control thread sleeps in a
read of its pipe and needs the GIL only for a recall or a cancel.
"""

from __future__ import annotations

import select
import threading
from collections import deque
from collections.abc import Callable

from . import pipes


class Outbox:
    """Frames to the parent, whole, from any thread of the child (the main thread's UP
    and DONE, relayed results and publishes, the control thread's RECALLED)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.lock = threading.Lock()

    def send(self, data: bytes) -> None:
        with self.lock:
            pipes.write_all(self.fd, data)


class Inbox:
    """Jobs from the parent, in order, minus the ones recalled before they started."""

    def __init__(self, job_fd: int, control_fd: int, outbox: Outbox) -> None:
        self.job_fd = job_fd
        self.control_fd = control_fd
        self.outbox = outbox
        self.lock = threading.Lock()
        self.pending: deque[tuple[int, bytes]] = deque()
        """Frames the control thread took from the job pipe and did not recall (and, in
        async mode, a frame that waits for room: ``child_aio.py``)."""
        self.on_pending: Callable[[], None] | None = None
        """Set while the child's loop reads the pipe (async mode): called after a recall
        took frames from the pipe, which the loop would otherwise not hear of."""
        self.cancelled: set[int] = set()
        """Seqs of async jobs the parent cancelled (CANCEL), shared with the loop's
        ``TaskSet``: a job here is cancelled as it starts, if it has not yet."""
        self.on_cancel: Callable[[int], None] | None = None
        """Set while the child's loop runs (async mode): cancels a running job, from the
        control thread."""

    def start(self) -> None:
        threading.Thread(target=self._control, name="celeriac-child-control",
                         daemon=True).start()

    def next(self) -> tuple[int, bytes] | None:
        """The next frame from the parent; None at EOF (the parent is gone)."""
        # Blocking in the read with the lock held is what makes a recall safe: the
        # control thread can only look while the main thread is not reading, so a job
        # is either taken here (and runs) or taken back there (and never runs).
        with self.lock:
            if self.pending:
                return self.pending.popleft()
            # Whatever the pipe holds, in one read (the job and, in a drain, the one the
            # parent queued behind it): what is not returned waits in ``pending``, where a
            # recall looks too.
            frames = pipes.read_frames(self.job_fd)
            if frames is None:
                return None
            self.pending.extend(frames[1:])
            return frames[0]

    def _control(self) -> None:
        while True:
            frame = pipes.read_frame(self.control_fd)
            if frame is None:
                return  # the parent is gone; the main thread sees EOF too
            kind, payload = frame
            if kind == pipes.RECALL:
                self._recall(int(payload))
                wake = self.on_pending
                if wake is not None and self.pending:
                    wake()
            elif kind == pipes.CANCEL:
                seq = int(payload)
                self.cancelled.add(seq)
                cancel = self.on_cancel
                if cancel is not None:
                    cancel(seq)

    def _recall(self, seq: int) -> None:
        with self.lock:
            # Whatever the parent has written is in the pipe by now (it sends RECALL
            # after the job): read it all without waiting for more.
            while select.select([self.job_fd], [], [], 0)[0]:
                frame = pipes.read_frame(self.job_fd)
                if frame is None:
                    break
                self.pending.append(frame)
            for frame in self.pending:
                if frame[0] == pipes.JOB and pipes.job_seq(frame[1]) == seq:
                    self.pending.remove(frame)
                    self.outbox.send(pipes.frame(pipes.RECALLED, str(seq).encode()))
                    return
            self.outbox.send(pipes.frame(pipes.STARTED, str(seq).encode()))
