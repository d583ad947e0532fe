"""The receiver shares its loop: working through one payload of thousands of events, it
lets the loop turn every few milliseconds (issue 24), and a payload of malformed items
costs one warning line."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

import orjson
import pytest

from celeriac import Celeriac
from celeriac.events import EventReceiver
from celeriac.events.dispatcher import EVENTS_CHANNEL

N = 10_000
HANDLER_COST = 50e-6
"""CPU seconds each event costs its handler: the whole payload, about half a second."""


def test_one_big_payload_is_handled_in_slices_that_let_the_loop_turn() -> None:
    app = Celeriac("t", broker=f"memory://{uuid.uuid4().hex}")
    events = [{"type": "worker-heartbeat", "hostname": f"fake{i}@h", "clock": i + 1}
              for i in range(N)]

    def handler(event: dict[str, Any]) -> None:
        end = time.perf_counter() + HANDLER_COST
        while time.perf_counter() < end:  # a costly handler's work
            pass

    async def main() -> tuple[int, int]:
        turns = 0
        done = asyncio.Event()

        async def other_work() -> None:  # what else runs on the loop (a ping, the pump)
            nonlocal turns
            while not done.is_set():
                await asyncio.sleep(0)  # sleep-ok: one loop turn, what is counted
                turns += 1

        async with EventReceiver(app, {"*": handler}) as receiver:
            app.transport.broadcast(EVENTS_CHANNEL, orjson.dumps(events), "worker.multi")
            first = await receiver.get(5)  # the payload is read: the rest is in hand
            assert first is not None
            other = asyncio.get_running_loop().create_task(other_work())
            await asyncio.sleep(0)  # sleep-ok: let other_work start before counting
            turns = 0
            handled = 1 + await receiver.acapture(limit=N - 1, timeout=60)
            done.set()
            await other
        return handled, turns

    handled, turns = asyncio.run(main())
    assert handled == N
    # ~0.5 s of handling in 5 ms slices: ~100 turns (more on a loaded machine, where the
    # same work takes longer). Without slices the loop never turned until the end.
    assert turns >= 20, turns


def test_a_payload_of_malformed_items_is_counted_and_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "celeriac.events")
    app = Celeriac("t", broker=f"memory://{uuid.uuid4().hex}")

    async def main() -> int:
        async with EventReceiver(app) as receiver:
            payload = orjson.dumps([*range(1000), {"type": "task-started", "uuid": "ok"}])
            app.transport.broadcast(EVENTS_CHANNEL, payload)
            event = await receiver.get(5)
            assert event is not None and event["uuid"] == "ok"
            return receiver.malformed

    assert asyncio.run(main()) == 1000
    warnings = [r for r in caplog.records if "malformed" in r.getMessage()]
    assert len(warnings) == 1
