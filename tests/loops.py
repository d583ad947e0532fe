"""``run(coro)``: ``asyncio.run`` that releases, before the loop ends, the connections
every transport a test made holds on that loop. A test often leaves a consumer as a crash
would (no ``disconnect``); without this its sockets would outlive their loop and end as
``ResourceWarning``s, which the suite turns into errors.

``until(predicate)``: ``celeriac.testing.wait_until`` for a coroutine (the loop keeps
turning while it polls)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from celeriac.transports.base import Transport

T = TypeVar("T")
TR = TypeVar("TR", bound=Transport)

_made: list[Transport] = []


def track(transport: TR) -> TR:
    """Release ``transport``'s loop connections at the end of every ``run``."""
    _made.append(transport)
    return transport


def forget() -> None:
    """The test is over: its transports are closed by its fixtures."""
    _made.clear()


async def until(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.005,
                message: str = "condition") -> None:
    """Return once ``predicate()`` is true (awaited, if it returns an awaitable: a
    transport's call); fail the test after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout

    async def holds() -> Any:
        value = predicate()
        return await value if inspect.isawaitable(value) else value

    while not await holds():
        assert loop.time() < deadline, f"{message} not met within {timeout}s"
        await asyncio.sleep(interval)  # sleep-ok: poll interval under the deadline


def run(coro: Coroutine[Any, Any, T]) -> T:
    async def main() -> T:
        try:
            return await coro
        finally:
            for transport in list(_made):
                await transport.release()

    return asyncio.run(main())
