"""A prefork pool child: the process that decodes and runs tasks.

Lifecycle: forked by the parent -> ``main()`` resets what must not be shared (signals,
random state, the parent's connections, other children's pipes), runs the
``worker_process_init`` hooks, reports UP, then loops: read a job, run it under its soft
time limit, write DONE. It exits on STOP, on EOF of its job pipe (the parent is gone), when
recycled (``max_tasks_per_child`` / ``max_memory_per_child``), or by the parent's SIGKILL.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import multiprocessing
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...backends.base import ResultBackend, Stored, backend_class
from ...errors import OperationalError, SoftTimeLimitExceeded
from ...protocol import Message
from ...runtime.progress import ProgressReporter
from ...transports.base import Outgoing, Publisher, transport_class
from ..execute import Job, Outcome, execute, is_async
from . import pipes
from .channels import Inbox, Outbox
from .child_aio import AsyncMode

if TYPE_CHECKING:
    from ...app import Celeriac

logger = logging.getLogger("celeriac.worker.pool.child")

PR_SET_PDEATHSIG = 1


def main(app: Celeriac, job_r: int, control_r: int, result_w: int,
         parent_fds: Sequence[int], max_tasks: int | None, max_memory_kib: int | None,
         task_events: bool = False) -> int:
    """Run the child; returns its exit code (the caller passes it to ``os._exit``)."""
    parent = os.getppid()
    _die_with_parent()
    multiprocessing.current_process().name = f"PoolChild-{os.getpid()}"
    _reset_signals()
    random.seed()
    for fd in parent_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    outbox = Outbox(result_w)
    relay = _fresh_connections(app, outbox)
    try:
        app.hooks.call_strict("worker_process_init")
    except Exception as exc:
        logger.error("worker_process_init failed in child %d: %r", os.getpid(), exc)
        return 2
    # What the child inherited and set up lives as long as it does: out of the collector's
    # sight, a full collection scans only what tasks made. (With 200 async tasks in
    # flight, full collections of the whole app took ~0.1 s each, stalling the loop.)
    gc.freeze()
    inbox = Inbox(job_r, control_r, outbox)
    if relay is not None:
        relay.inbox = inbox  # chord_part reads its answers from the job pipe
    inbox.start()
    outbox.send(pipes.frame(pipes.UP, str(os.getpid()).encode()))
    # Told at fork whether task events are on: without them there is no reporter, so
    # update_state writes no PROGRESS frame and the job loop pays one test of None.
    reporter = ProgressReporter(
        lambda task_id, state, meta: outbox.send(pipes.encode_progress(task_id, state, meta))
    ) if task_events else None

    try:
        return _serve(app, inbox, outbox, parent, max_tasks, max_memory_kib, task_events,
                      reporter)
    finally:
        if app.hooks:
            app.hooks.call("worker_process_shutdown")


class Recycle:
    """Counts the child's finished tasks; ``after_task`` says when it must recycle."""

    def __init__(self, max_tasks: int | None, max_memory_kib: int | None) -> None:
        self.done = 0
        self.max_tasks = max_tasks
        self.max_memory_kib = max_memory_kib

    def after_task(self) -> bool:
        self.done += 1
        return _should_retire(self.done, self.max_tasks, self.max_memory_kib)


def _serve(app: Celeriac, inbox: Inbox, outbox: Outbox, parent: int, max_tasks: int | None,
           max_memory_kib: int | None, task_events: bool,
           reporter: ProgressReporter | None = None) -> int:
    recycle = Recycle(max_tasks, max_memory_kib)
    aio: AsyncMode | None = None
    while True:
        frame = inbox.next()
        if frame is None:
            return 0  # EOF: the parent closed our pipe or died
        kind, payload = frame
        if kind == pipes.STOP:
            return 0
        job, soft_limit, hard_limit = pipes.decode_job(payload)
        if is_async(app, job.headers):
            # Async mode until no async job is in flight (child_aio.py); made on the
            # first async job, so a child that never runs one has no loop.
            if aio is None:
                aio = AsyncMode(app, inbox, outbox, recycle.after_task, task_events,
                                reporter)
            code = aio.serve(job, soft_limit, hard_limit)
            if code is not None or os.getppid() != parent:
                return code or 0
            continue
        if reporter is None:
            outcome = _run(app, job, soft_limit, task_events)
        else:
            task_id = job.headers["id"]
            reporter.begin(task_id)
            try:
                outcome = _run(app, job, soft_limit, task_events)
            finally:
                # Before DONE: the last progress precedes the task's final event.
                reporter.end(task_id)
        if job.settle is not None and outcome.action == "ack":
            outcome = _settle(app, job.settle, outcome)
        retire = recycle.after_task()
        # The result travels with DONE: the parent stores it (batched with other
        # children's) before it acknowledges the message; unless this child settled it.
        outbox.send(pipes.encode_done(job.seq, outcome, retire))
        if retire:
            return 0
        if os.getppid() != parent:
            return 0


def _run(app: Celeriac, job: Job, soft_limit: float | None, task_events: bool) -> Outcome:
    if soft_limit:
        signal.setitimer(signal.ITIMER_REAL, soft_limit)
    try:
        return execute(app, job, task_events)
    except SoftTimeLimitExceeded as exc:  # fired outside the task body (rare)
        return Outcome("ack", None, repr(exc))
    finally:
        if soft_limit:
            signal.setitimer(signal.ITIMER_REAL, 0)


SETTLE_PAUSE = 30.0
"""Seconds a child settles nothing itself after its broker call failed."""
_settle_failed: float | None = None


def _settle(app: Celeriac, settle: tuple[str, ...], outcome: Outcome) -> Outcome:
    """Store the result and ack the message from here (an idle worker's job: see
    ``Job.settle``), so the caller waiting for the result need not wait for the parent to
    read DONE, wake its pump and make the same call. The ack still follows the store
    (one script). If the call fails, DONE carries the result as usual and the parent
    settles it; a repeat of a call that ran after all does no harm."""
    global _settle_failed
    now = time.monotonic()
    if _settle_failed is not None and now - _settle_failed < SETTLE_PAUSE:
        return outcome
    try:
        app.transport.settle_here(settle, outcome.stored)
    except Exception as exc:
        _settle_failed = now
        logger.warning("child %d could not settle a message itself (%s: %s); the worker "
                       "settles its messages for %.0fs", os.getpid(), type(exc).__name__,
                       exc, SETTLE_PAUSE)
        return outcome
    return Outcome(outcome.action, outcome.state, outcome.reason, outcome.runtime, None,
                   outcome.shown, settled=True)


def _should_retire(done: int, max_tasks: int | None, max_memory_kib: int | None) -> bool:
    if max_tasks and done >= max_tasks:
        return True
    return bool(max_memory_kib and rss_kib() > max_memory_kib)


def rss_kib() -> int:
    """Current resident set size of this process in KiB."""
    try:
        with open("/proc/self/statm", "rb") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") // 1024
    except OSError:
        import resource  # deferred: Unix only, and only without /proc

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the EOF on the job pipe still ends us


def _soft_limit(signum: int, frame: Any) -> None:
    raise SoftTimeLimitExceeded("soft time limit exceeded")


def _reset_signals() -> None:
    # The parent coordinates shutdown: a Ctrl-C to the whole process group (a terminal)
    # or a SIGTERM to the whole cgroup (systemd) must not kill a child mid-task. The
    # parent stops children with a STOP frame, or SIGKILL on a cold shutdown. The
    # parent's asyncio wakeup fd is not ours to write to.
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    for sig in (signal.SIGCHLD, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGALRM, _soft_limit)


_INHERITED: list[Any] = []


def _fresh_connections(app: Celeriac, outbox: Outbox) -> RelayBackend | None:
    """The child's own connections (``Celeriac.adopt_fork``): relays through ``outbox``
    for a broker or backend that lives in the parent's memory; the relay backend if any."""
    s = app.settings
    publisher = (RelayPublisher(s.broker_url, s, outbox)
                 if transport_class(s.broker_url).process_local else None)
    relay = (RelayBackend(s.backend_url, s, outbox)
             if backend_class(s.backend_url).process_local else None)
    # Keep the parent's connection objects alive but unused: closing an inherited SQLite
    # or socket handle from the child could disturb the parent's use of it.
    _INHERITED.append(app.adopt_fork(publisher=publisher, backend=relay))
    return relay


class RelayPublisher(Publisher):
    """In a child, publishes (task retries) to a broker that lives in the parent's memory."""

    def __init__(self, url: str, settings: Any, outbox: Outbox) -> None:
        super().__init__(url, settings)
        self.outbox = outbox

    def publish_many(self, items: Sequence[Outgoing]) -> None:
        for item in items:
            self.check_size(item.message)
            meta = {"queue": item.queue, "delay": item.delay,
                    "envelope": item.message.envelope().decode()}
            self.outbox.send(pipes.frame_with_blob(pipes.RELAY_PUBLISH, meta,
                                                   item.message.body))


class RelayBackend(ResultBackend):
    """In a child, stores results in a backend that lives in the parent's memory.

    ``chord_part`` is a request and an answer: the parent counts the part in its backend
    (the one copy of the chord's state, so the count is atomic across the children) and
    answers CHORD_ANSWER on the job pipe. The main thread, which runs the tasks, reads
    that pipe only in ``Inbox.next`` between tasks, so the answer is read here, under the
    inbox's lock (as ``Inbox.next`` does); jobs and STOP frames the parent sent before it
    go to ``Inbox.pending``, in order, for ``Inbox.next`` to return later.
    """

    scheme = "relay"

    def __init__(self, url: str, settings: Any, outbox: Outbox) -> None:
        super().__init__(url, settings)
        self.outbox = outbox
        self.inbox: Inbox | None = None

    def store_many(self, items: Sequence[Stored]) -> None:
        for task_id, content_type, data, expires_at in items:
            meta = (task_id, content_type, expires_at)
            self.outbox.send(pipes.frame_with_blob(pipes.RELAY_RESULT, meta, data))

    def _get(self, task_ids: Sequence[str]) -> dict[str, tuple[str, bytes]]:
        raise NotImplementedError("read results from the caller, not from a pool child")

    def _wait(self, timeout: float) -> None:
        raise NotImplementedError

    def forget(self, task_id: str) -> None:
        raise NotImplementedError

    def cleanup(self) -> int:
        return 0

    def chord_part(self, group_id: str, task_id: str, size: int) -> bool:
        inbox = self.inbox
        if inbox is None:
            raise OperationalError("chord_part in a pool child before its inbox is set up")
        if threading.current_thread() is not threading.main_thread():
            # Only the main thread may take frames from the job pipe between tasks: a
            # thread's answer could otherwise be read by Inbox.next as a job.
            raise OperationalError(
                "chords on a process-local result backend (memory://) are counted from "
                "the thread that runs the task in a pool child; use a result backend "
                "shared between processes (redis, postgresql, sqlite) otherwise")
        self.outbox.send(pipes.encode_chord_part(group_id, task_id, size))
        answer = pipes.decode_chord_answer(_take_answer(inbox))
        if isinstance(answer, str):
            raise OperationalError(f"chord_part failed in the worker's main process: {answer}")
        return answer


def _take_answer(inbox: Inbox) -> bytes:
    """The payload of the parent's next CHORD_ANSWER (one request is outstanding: the
    main thread's)."""
    with inbox.lock:
        # The control thread may have taken it from the pipe (with the jobs before it)
        # while answering a RECALL.
        for frame in inbox.pending:
            if frame[0] == pipes.CHORD_ANSWER:
                inbox.pending.remove(frame)
                return frame[1]
        while True:
            read = pipes.read_frame(inbox.job_fd)
            if read is None:
                raise OperationalError("the worker's main process went away before it "
                                       "answered chord_part")
            if read[0] == pipes.CHORD_ANSWER:
                return read[1]
            inbox.pending.append(read)  # a job or STOP sent before the answer


def decode_relayed_message(meta: dict[str, Any], body: bytes) -> Message:
    return Message.from_envelope(meta["envelope"].encode(), body)
