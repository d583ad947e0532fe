"""``task_send_sent_event``: a producer announces every message it publishes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from celeriac import Celeriac
from celeriac.events import EventReceiver


def _sent_events(app: Celeriac, send: Any, count: int) -> list[dict[str, Any]]:
    async def main() -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        async with EventReceiver(app, {"task-sent": got.append}) as receiver:
            await asyncio.to_thread(send)
            await asyncio.to_thread(app.events.flush, 5.0)
            await receiver.acapture(limit=count, timeout=5.0)
        return got

    return asyncio.run(main())


@pytest.mark.parametrize("hide", [False, True])
def test_send_task_and_send_many_send_task_sent(tmp_path: Path, hide: bool) -> None:
    app = Celeriac("sent", broker_url=f"sqlite:///{tmp_path}/b.db", task_send_sent_event=True,
                   events_hide_args=hide)
    try:
        def send() -> None:
            app.send_task("add", (1, 2), queue="q1", retries=1)
            app.send_many("mul", [(3, 4), (5, 6)])

        events = _sent_events(app, send, 3)
    finally:
        app.close()
    assert [(e["name"], e["queue"]) for e in events] == [
        ("add", "q1"), ("mul", "celery"), ("mul", "celery")]
    first = events[0]
    assert first["retries"] == 1 and len(first["uuid"]) == 36 and first["hostname"]
    if hide:
        assert all("args" not in e and "kwargs" not in e for e in events)
    else:
        assert first["args"] == "(1, 2)" and events[2]["args"] == "(5, 6)"


def test_no_task_sent_by_default(tmp_path: Path) -> None:
    app = Celeriac("quiet", broker_url=f"sqlite:///{tmp_path}/b.db")
    try:
        app.send_task("add", (1, 2))
        assert app._events is None  # no dispatcher, no thread, nothing sent
    finally:
        app.close()
