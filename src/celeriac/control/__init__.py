"""Remote control, the caller's side: ``app.control`` (``Control``) and ``Inspect``, as
Celery's.

Calls are synchronous like ``delay()``. Underneath, one event loop per ``Control`` runs
in a daemon thread with a transport of its own (the Redis and AMQP subscriptions are
asynchronous clients, and a loop kept between calls keeps their connections warm: a
call costs a SUBSCRIBE, a PUBLISH and the replies, not a new client). A call with
``reply=True`` subscribes to its ticket's reply channel first, then broadcasts the
command, then gathers ``{hostname: reply}`` mappings until ``limit`` of them (by default
the length of ``destination``) or ``timeout`` seconds, and unsubscribes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ..compat.pidbox import reply_exchange_for
from ..runtime.state import current_app
from ..transports.base import Transport, create_transport

# The command families register themselves with the registry as they are imported:
# from here, above both, so that the registry imports neither.
from . import control_commands, inspect_commands  # noqa: F401
from .mailbox import CONTROL_CHANNEL, encode_command, new_ticket, reply_channel
from .mailbox import decode_reply as _decode_reply
from .store import store_for

if TYPE_CHECKING:
    from ..app import Celeriac
    from ..stores import SharedStore

T = TypeVar("T")
Reply = dict[str, Any]
Callback = Callable[[Reply], None]
DEFAULT_TIMEOUT = 1.0


class _CallerLoop:
    """An event loop in a daemon thread; ``run`` hands it a coroutine and waits."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.pid = os.getpid()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("app.control called from its own event loop")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
        if not self.loop.is_running() and not self.loop.is_closed():
            self.loop.close()


class Control:
    """``app.control``: broadcast commands to workers and gather their replies."""

    def __init__(self, app: Celeriac) -> None:
        self.app = app
        self._lock = threading.Lock()
        self._runner: _CallerLoop | None = None
        self._transport: Transport | None = None
        self._store: tuple[int, SharedStore | None] | None = None

    # -- plumbing -----------------------------------------------------------------------
    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        with self._lock:
            if self._runner is None or self._runner.pid != os.getpid():
                # A forked child never uses its parent's thread or sockets.
                self._runner, self._transport = _CallerLoop("celeriac-control"), None
            runner = self._runner
        return runner.run(coro)

    def _get_transport(self) -> Transport:
        if self._transport is None:
            self.app.finalize()
            self._transport = create_transport(self.app.settings.broker_url,
                                               self.app.settings)
        return self._transport

    def close(self) -> None:
        """Close the connections and the thread of this process's calls."""
        with self._lock:
            runner, self._runner = self._runner, None
            transport, self._transport = self._transport, None
            store, self._store = self._store, None
        if store is not None and store[1] is not None and store[0] == os.getpid():
            store[1].close()
        if runner is None or runner.pid != os.getpid():
            return
        if transport is not None:
            async def release() -> None:
                await transport.release()
                transport.close()

            with contextlib.suppress(Exception):  # a broker gone: nothing to release
                runner.run(release())
        runner.stop()

    # -- the call -------------------------------------------------------------------------
    def broadcast(self, command: str, arguments: dict[str, Any] | None = None,
                  destination: Sequence[str] | str | None = None, connection: Any = None,
                  reply: bool = False, timeout: float = DEFAULT_TIMEOUT,
                  limit: int | None = None, callback: Callback | None = None,
                  channel: Any = None, pattern: str | None = None,
                  matcher: str | None = None) -> list[Reply] | None:
        """Send ``command`` to every worker, or those in ``destination``; with ``reply``
        return the replies (``[{hostname: reply}, ...]``) that came within ``timeout``
        seconds, stopping early at ``limit`` replies (default: ``len(destination)``)."""
        if isinstance(destination, str):
            destination = [destination]
        if timeout < 0:
            raise ValueError(f"timeout must be >= 0, got {timeout!r}")
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit!r}")
        if limit is None and destination:
            limit = len(destination)
        settings = self.app.settings
        ticket = new_ticket()
        payload = encode_command(command, arguments, destination=destination, ticket=ticket,
                                 reply=reply, pattern=pattern, matcher=matcher,
                                 signing_key=settings.control_signing_key,
                                 reply_exchange=reply_exchange_for(settings.broker_url))
        return self._run(self._call(command, payload, ticket, reply, timeout, limit,
                                    callback))

    async def _call(self, command: str, payload: bytes, ticket: str, reply: bool,
                    timeout: float, limit: int | None, callback: Callback | None
                    ) -> list[Reply] | None:
        transport = self._get_transport()
        if not reply:
            transport.broadcast(CONTROL_CHANNEL, payload, command)
            return None
        return await gather(transport, command, payload, ticket, timeout, limit, callback)

    # -- Celery's API -----------------------------------------------------------------------
    def inspect(self, destination: Sequence[str] | str | None = None,
                timeout: float = DEFAULT_TIMEOUT, callback: Callback | None = None,
                connection: Any = None, app: Celeriac | None = None,
                limit: int | None = None, pattern: str | None = None,
                matcher: str | None = None) -> Inspect:
        return Inspect(destination=destination, timeout=timeout, callback=callback,
                       app=app or self.app, limit=limit, pattern=pattern, matcher=matcher)

    def _act(self, command: str, arguments: dict[str, Any] | None = None,
             destination: Sequence[str] | str | None = None, **kwargs: Any
             ) -> list[Reply] | None:
        return self.broadcast(command, arguments, destination, **kwargs)

    def ping(self, destination: Sequence[str] | str | None = None,
             timeout: float = DEFAULT_TIMEOUT, **kwargs: Any) -> list[Reply]:
        return self.broadcast("ping", reply=True, destination=destination, timeout=timeout,
                              **kwargs) or []

    def revoke(self, task_id: str | Iterable[str], destination: Sequence[str] | str | None
               = None, terminate: bool = False, signal: str = "SIGTERM", **kwargs: Any
               ) -> list[Reply] | None:
        """Revoke ``task_id`` (or several): workers will not run it, and with
        ``terminate`` kill the process running it. Recorded in the shared store too
        (``control/store.py``), so a worker that starts later honours it."""
        ids = [task_id] if isinstance(task_id, str) else list(task_id)
        self.record_revoked(ids)
        return self._act("revoke", {"task_id": ids, "terminate": terminate,
                                    "signal": signal}, destination, **kwargs)

    def record_revoked(self, ids: Sequence[str]) -> None:
        """Write ``ids`` to the shared store's revoked ids (where there is one)."""
        if not ids:
            return
        with self._lock:
            if self._store is None or self._store[0] != os.getpid():
                self._store = (os.getpid(), store_for(self.app))
            store = self._store[1]
        if store is not None:
            store.revoke(ids, time.time() + self.app.settings.worker_revoke_expires)

    def revoke_by_stamped_headers(self, headers: dict[str, Any] | list[str],
                                  destination: Sequence[str] | str | None = None,
                                  terminate: bool = False, signal: str | None = "SIGTERM",
                                  **kwargs: Any) -> list[Reply] | None:
        """Celery's: workers do not run tasks whose stamps match ``headers`` (stamp name
        -> value or list of values; Celery's ``stamped_headers``/``stamps`` message
        headers), and with ``terminate`` kill those running. Broadcast only, as in
        Celery: workers keep the flags in memory (``celeriac.worker.state.revoked_stamps``)
        and one that starts later does not know them."""
        if isinstance(headers, Mapping):
            headers = dict(headers)
        elif not isinstance(headers, list):
            raise TypeError("revoke_by_stamped_headers: headers must be a dict of stamp "
                            f"names to values, got {type(headers).__name__}")
        return self._act("revoke_by_stamped_headers",
                         {"headers": headers, "terminate": terminate, "signal": signal},
                         destination, **kwargs)

    def purge(self, connection: Any = None) -> int:
        """Celery's: delete the messages waiting in the app's queues (``task_queues``,
        else ``task_default_queue``); returns how many. Tasks already in a worker's hands
        are not affected (revoke them)."""
        transport = self.app.transport
        return sum(transport.purge(queue) for queue in self.app.default_queues)

    discard_all = purge

    def terminate(self, task_id: str | Iterable[str], destination: Sequence[str] | str |
                  None = None, signal: str = "SIGTERM", **kwargs: Any) -> list[Reply] | None:
        return self.revoke(task_id, destination, terminate=True, signal=signal, **kwargs)

    def rate_limit(self, task_name: str, rate_limit: str | float | int | None,
                   destination: Sequence[str] | str | None = None, **kwargs: Any
                   ) -> list[Reply] | None:
        return self._act("rate_limit", {"task_name": task_name, "rate_limit": rate_limit},
                         destination, **kwargs)

    def time_limit(self, task_name: str, soft: float | None = None, hard: float | None = None,
                   destination: Sequence[str] | str | None = None, **kwargs: Any
                   ) -> list[Reply] | None:
        return self._act("time_limit", {"task_name": task_name, "soft": soft, "hard": hard},
                         destination, **kwargs)

    def pool_grow(self, n: int = 1, destination: Sequence[str] | str | None = None,
                  **kwargs: Any) -> list[Reply] | None:
        return self._act("pool_grow", {"n": n}, destination, **kwargs)

    def pool_shrink(self, n: int = 1, destination: Sequence[str] | str | None = None,
                    **kwargs: Any) -> list[Reply] | None:
        return self._act("pool_shrink", {"n": n}, destination, **kwargs)

    def autoscale(self, max: int, min: int, destination: Sequence[str] | str | None = None,
                  **kwargs: Any) -> list[Reply] | None:
        return self._act("autoscale", {"max": max, "min": min}, destination, **kwargs)

    def add_consumer(self, queue: str, exchange: str | None = None,
                     exchange_type: str = "direct", routing_key: str | None = None,
                     options: dict[str, Any] | None = None,
                     destination: Sequence[str] | str | None = None, **kwargs: Any
                     ) -> list[Reply] | None:
        return self._act("add_consumer", {"queue": queue}, destination, **kwargs)

    def cancel_consumer(self, queue: str, destination: Sequence[str] | str | None = None,
                        **kwargs: Any) -> list[Reply] | None:
        return self._act("cancel_consumer", {"queue": queue}, destination, **kwargs)

    def enable_events(self, destination: Sequence[str] | str | None = None, **kwargs: Any
                      ) -> list[Reply] | None:
        return self._act("enable_events", None, destination, **kwargs)

    def disable_events(self, destination: Sequence[str] | str | None = None, **kwargs: Any
                       ) -> list[Reply] | None:
        return self._act("disable_events", None, destination, **kwargs)

    def heartbeat(self, destination: Sequence[str] | str | None = None, **kwargs: Any
                  ) -> list[Reply] | None:
        return self._act("heartbeat", None, destination, **kwargs)

    def shutdown(self, destination: Sequence[str] | str | None = None, **kwargs: Any
                 ) -> list[Reply] | None:
        return self._act("shutdown", None, destination, **kwargs)


async def gather(transport: Transport, command: str, payload: bytes, ticket: str,
                 timeout: float, limit: int | None, callback: Callback | None = None
                 ) -> list[Reply]:
    """Broadcast ``payload`` (a command with ``ticket``) and gather the replies until
    ``limit`` of them or ``timeout`` seconds. On the caller's event loop."""
    # Subscribed before the command goes out: no reply can come before we listen.
    sub = await transport.subscribe(reply_channel(ticket))
    replies: list[Reply] = []
    try:
        transport.broadcast(CONTROL_CHANNEL, payload, command)
        deadline = time.monotonic() + timeout
        while limit is None or len(replies) < limit:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            data = await sub.get(remaining)
            if data is None:
                break
            one = _decode_reply(data)
            if one is None:
                continue
            replies.append(one)
            if callback is not None:
                callback(one)
    finally:
        await sub.close()
    return replies


def merge(replies: list[Reply] | None) -> dict[str, Any] | None:
    """Celery's inspect result: one ``{hostname: reply}`` mapping, None if nobody
    replied."""
    if not replies:
        return None
    out: dict[str, Any] = {}
    for one in replies:
        out.update(one)
    return out


class Inspect:
    """``app.control.inspect(destination=, timeout=, limit=)``: each method asks the
    workers and returns ``{hostname: reply}``, or None when no worker replied."""

    def __init__(self, destination: Sequence[str] | str | None = None,
                 timeout: float = DEFAULT_TIMEOUT, callback: Callback | None = None,
                 connection: Any = None, app: Celeriac | None = None,
                 limit: int | None = None, pattern: str | None = None,
                 matcher: str | None = None) -> None:
        if app is None:
            app = current_app()
        self.app = app
        self.destination = destination
        self.timeout = timeout
        self.callback = callback
        self.limit = limit
        self.pattern = pattern
        self.matcher = matcher

    def _request(self, command: str, **arguments: Any) -> dict[str, Any] | None:
        return merge(self.app.control.broadcast(
            command, arguments={k: v for k, v in arguments.items() if v is not None},
            destination=self.destination, reply=True, timeout=self.timeout,
            limit=self.limit, callback=self.callback, pattern=self.pattern,
            matcher=self.matcher))

    def ping(self, destination: Sequence[str] | str | None = None) -> dict[str, Any] | None:
        if destination is not None:
            self.destination = destination
        return self._request("ping")

    def active(self, safe: bool | None = None) -> dict[str, Any] | None:
        return self._request("active")

    def reserved(self, safe: bool | None = None) -> dict[str, Any] | None:
        return self._request("reserved")

    def scheduled(self, safe: bool | None = None) -> dict[str, Any] | None:
        return self._request("scheduled")

    def revoked(self) -> dict[str, Any] | None:
        return self._request("revoked")

    def registered(self, *taskinfoitems: str) -> dict[str, Any] | None:
        return self._request("registered", taskinfoitems=list(taskinfoitems) or None)

    registered_tasks = registered

    def stats(self) -> dict[str, Any] | None:
        return self._request("stats")

    def active_queues(self) -> dict[str, Any] | None:
        return self._request("active_queues")

    def conf(self, with_defaults: bool = False) -> dict[str, Any] | None:
        return self._request("conf", with_defaults=with_defaults)

    def query_task(self, *ids: str | Iterable[str]) -> dict[str, Any] | None:
        flat = [i for x in ids for i in ([x] if isinstance(x, str) else x)]
        return self._request("query_task", ids=flat)

    def report(self) -> dict[str, Any] | None:
        return self._request("report")

    def hello(self, from_node: str, revoked: Any = None) -> dict[str, Any] | None:
        return self._request("hello", from_node=from_node)

    def clock(self) -> dict[str, Any] | None:
        return self._request("clock")

__all__ = ["Control", "Inspect", "gather", "merge"]
