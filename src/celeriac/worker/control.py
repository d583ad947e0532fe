"""The worker's ``ControlStep`` (Celery's ``Control`` bootstep; ``app.control`` is the
caller's side): it answers remote-control commands.

It subscribes to ``celeriac.control`` on a transport of its own and handles each command
on the worker's event loop as it arrives: the commands read and change the worker's
books (the consumer's reserved jobs, the pool, the revoked set), which live on that loop,
and none waits for a running task, so a worker whose every child is busy still answers
``ping`` at once. Replies are sent from one helper thread (a broadcast is a blocking
client call; a broker that is down must not stall the loop), in order.

A command for another node (``destination``, ``pattern``) is dropped unread. A malformed
one is logged and dropped. An unknown command, bad arguments, a refused signature or a
mutating command under ``worker_remote_control = "read-only"`` gets
``{"error": "..."}`` naming the problem; the worker goes on.

The step starts before the pool and the consumer and stops after them, so the worker
answers during a warm shutdown while its last tasks finish (and can terminate them).
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import inspect
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ..control.mailbox import (
    CONTROL_CHANNEL,
    Command,
    Verifier,
    decode_command,
    encode_reply,
    error,
    ok,
)
from ..control.registry import load as load_commands
from ..errors import ControlError
from ..events.clock import LamportClock
from ..transports.base import Subscription, Transport, create_transport
from .autoscale import Autoscaler
from .blueprint import Step
from .consumer import signal_number as signal_number
from .heart import Heart
from .pool.prefork import PreforkPool
from .revoked import Revoked, StateDB
from .state import add_revoked_stamps, message_stamps, stamps_match
from .task_events import TaskEvents

if TYPE_CHECKING:
    from ..events import EventDispatcher
    from .consumer import Consumer
    from .pool.base import Pool

logger = logging.getLogger("celeriac.worker.control")

BACKOFF_MAX = 2.0


class ControlState:
    """What a command handler sees: the worker and the parts it may read or change."""

    def __init__(self, step: ControlStep) -> None:
        w = step.worker
        self.step = step
        self.worker = w
        self.app = w.app
        self.hostname = w.hostname
        self.revoked: Revoked = w.revoked
        self.started = time.time()
        self._clock = LamportClock()

    @property
    def clock(self) -> LamportClock:
        events = self.worker.events
        return events.clock if events is not None else self._clock

    @property
    def consumer(self) -> Consumer | None:
        consumer: Consumer | None = getattr(self.worker, "consumer", None)
        return consumer

    @property
    def pool(self) -> Pool | None:
        return self.worker.pool if getattr(self.worker, "_pool_started", False) else None

    # The parts of the worker some commands need, found here so that control/ imports
    # nothing of the worker (the commands get this object).
    @property
    def prefork_pool(self) -> PreforkPool | None:
        """The pool, if it runs and is prefork's (children to resize or to list)."""
        pool = self.pool
        return pool if isinstance(pool, PreforkPool) else None

    @property
    def autoscaler(self) -> Autoscaler | None:
        """The ``--autoscale`` step, once it runs."""
        step = self.worker.steps.get(Autoscaler)
        return step if isinstance(step, Autoscaler) and step.entry is not None else None

    @property
    def heart(self) -> Heart | None:
        """The step that sends the worker's heartbeat events, if this worker has one."""
        step = self.worker.steps.get(Heart)
        return step if isinstance(step, Heart) else None

    def task_events(self, dispatcher: EventDispatcher) -> TaskEvents:
        """The consumer's task events (``-E``), sent through ``dispatcher``."""
        return TaskEvents(dispatcher, self.app.settings.events_hide_args)

    def revoke(self, ids: list[str], terminate: bool, signal: str | None) -> dict[str, str]:
        """Remember ``ids``; settle the ones waiting in this worker now; with
        ``terminate`` kill the child running one (at once, or when it starts if it waits
        behind another task in a child), or cancel an ``async def`` one on its loop (the
        pool's ``terminate_job``)."""
        signum = signal_number(signal or "SIGTERM")
        for task_id in ids:
            self.revoked.add(task_id)
        consumer = self.consumer
        if consumer is not None:
            consumer.revoke_waiting(set(ids))
        logger.info("tasks flagged as revoked: %s", ", ".join(ids))
        if not terminate:
            return ok(f"tasks {', '.join(ids)} flagged as revoked")
        pool = self.pool
        killed: list[str] = []
        for job in pool.running() if pool is not None else []:
            task_id = job.headers["id"]
            if task_id not in ids:
                continue
            terminate_job = getattr(pool, "terminate_job", None)
            if terminate_job is None:
                raise ControlError(f"terminate: the {self.worker.pool_name} pool cannot "
                                   "kill a running task (use prefork); it is revoked")
            if terminate_job(task_id, signum):
                killed.append(task_id)
            else:  # waiting behind another task in a child: killed as it starts
                self.revoked.terminate[task_id] = signal or "SIGTERM"
        return ok(f"terminate: {', '.join(killed)}" if killed else "terminate: tasks unknown")

    def revoke_by_stamped_headers(self, headers: dict[str, Any], terminate: bool,
                                  signal: str | None) -> dict[str, str]:
        """Celery's: flag these stamps revoked (``worker/state.py``), settle the waiting
        jobs they match; with ``terminate`` kill the running ones (as ``revoke``)."""
        signal_number(signal or "SIGTERM")  # a bad signal is refused before any change
        add_revoked_stamps(headers)
        consumer = self.consumer
        if consumer is not None:
            consumer.revoke_waiting()
        logger.info("stamped headers flagged as revoked: %s", headers)
        if not terminate:
            return ok(f"headers {headers} flagged as revoked, but not terminated")
        pool = self.pool
        matched: dict[str, list[Any]] = {}
        ids: list[str] = []
        for job in pool.running() if pool is not None else []:
            hits = stamps_match(message_stamps(job.headers), headers)
            if not hits:
                continue
            for name, values in hits.items():
                known = matched.setdefault(name, [])
                known.extend(v for v in values if v not in known)
            ids.append(job.headers["id"])
        if not ids:
            return ok(f"headers {headers} were not terminated")
        self.revoke(ids, True, signal)  # kills them (or as they start), and remembers
        return ok(f"headers {matched} revoked")


class ControlStep(Step):
    requires = (StateDB,)

    async def start(self) -> None:
        w = self.worker
        s = w.app.settings
        self.commands = load_commands()
        self.state = ControlState(self)
        self.mode = s.worker_remote_control
        self.verifier = (Verifier(s.control_signing_key, s.control_max_age)
                         if s.control_signing_key else None)
        self.serving: asyncio.Task[None] | None = None
        self.pending: set[asyncio.Task[Any]] = set()
        if self.mode is False:
            logger.info("remote control is off (worker_remote_control=False)")
            return
        self.transport: Transport = create_transport(s.broker_url, s)
        self.sub: Subscription | None = await self.transport.subscribe(CONTROL_CHANNEL)
        self.replies = ThreadPoolExecutor(1, thread_name_prefix="celeriac-control")
        self.serving = asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> None:
        attempt = 0
        while True:
            try:
                if self.sub is None:
                    self.sub = await self.transport.subscribe(CONTROL_CHANNEL)
                    logger.warning("control: subscribed again")
                    attempt = 0
                payload = await self.sub.get(1.0)
            except Exception as exc:  # any client error: the subscription is gone
                if attempt == 0:
                    logger.warning("control: subscription lost (%s); subscribing again", exc)
                sub, self.sub = self.sub, None
                if sub is not None:
                    with contextlib.suppress(Exception):
                        await sub.close()
                await asyncio.sleep(min(0.1 * 2 ** attempt, BACKOFF_MAX))
                attempt += 1
                continue
            if payload is not None:
                self.handle(payload)

    def handle(self, payload: bytes) -> None:
        """Answer one command (on the loop; a coroutine handler goes on in a task)."""
        try:
            cmd = decode_command(payload)
        except ControlError as exc:
            logger.warning("control: ignoring a malformed command: %s", exc)
            return
        if not self._for_me(cmd):
            return
        reply = self.dispatch(cmd)
        if inspect.isawaitable(reply):
            task = asyncio.get_running_loop().create_task(self._finish(cmd, reply))
            self.pending.add(task)
            task.add_done_callback(self.pending.discard)
            return
        self._reply(cmd, reply)

    async def _finish(self, cmd: Command, awaitable: Any) -> None:
        try:
            reply = await awaitable
        except ControlError as exc:
            reply = error(str(exc))
        except Exception as exc:
            logger.exception("control: %s failed", cmd.method)
            reply = error(f"{cmd.method} failed: {type(exc).__name__}: {exc}")
        self._reply(cmd, reply)

    def _for_me(self, cmd: Command) -> bool:
        hostname = self.state.hostname
        if cmd.destination:
            return hostname in cmd.destination
        if cmd.pattern:
            if cmd.matcher in (None, "glob"):
                return fnmatch.fnmatchcase(hostname, cmd.pattern)
            if cmd.matcher == "pcre":
                with contextlib.suppress(re.error):
                    return re.search(cmd.pattern, hostname) is not None
            return False
        return True

    def dispatch(self, cmd: Command) -> Any:
        """The reply to ``cmd``, or an awaitable of it; never raises."""
        if self.verifier is not None:
            try:
                self.verifier.check(cmd)
            except ControlError as exc:
                logger.warning("control: %s (ticket %s) %s", cmd.method, cmd.ticket, exc)
                return error(str(exc))
        spec = self.commands.get(cmd.method)
        if spec is None:
            return error(f"unknown command {cmd.method!r}")
        if self.mode == "read-only" and not spec.read_only:
            return error(f"{cmd.method}: refused, remote control is read-only on this "
                         "worker (worker_remote_control='read-only')")
        try:
            return spec.call(self.state, cmd.arguments)
        except ControlError as exc:
            return error(str(exc))
        except Exception as exc:
            logger.exception("control: %s failed", cmd.method)
            return error(f"{cmd.method} failed: {type(exc).__name__}: {exc}")

    def _reply(self, cmd: Command, reply: Any) -> None:
        channel = cmd.reply_channel
        if channel is None:
            return
        data = encode_reply(self.state.hostname, reply)
        # The ticket goes along: Celery's caller on the kombu layout reads it in a header.
        future = self.replies.submit(self.transport.broadcast, channel, data,
                                     cmd.ticket or "")
        future.add_done_callback(_reply_sent)

    async def stop(self) -> None:
        serving, self.serving = self.serving, None
        if serving is None:
            return
        serving.cancel()
        await asyncio.gather(serving, *self.pending, return_exceptions=True)
        sub, self.sub = self.sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.close()
        # Replies already queued (the answer to ``shutdown``) go out before we close.
        await asyncio.to_thread(self.replies.shutdown, True)
        with contextlib.suppress(Exception):
            await self.transport.release()
        self.transport.close()


def _reply_sent(future: Any) -> None:
    exc = future.exception()
    if exc is not None:
        logger.warning("control: a reply could not be sent: %s", exc)
