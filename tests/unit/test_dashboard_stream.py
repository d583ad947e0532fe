"""The dashboard's live side: the SSE hub, slow clients, and events through a real server."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import uvicorn

from celeriac import Celeriac
from celeriac.dashboard import create_app, stream
from celeriac.dashboard.monitor import UPDATE_BATCH, Monitor
from celeriac.dashboard.stream import EventStream, Hub
from celeriac.events import EventDispatcher
from celeriac.testing import wait_until
from tests.unit.test_dashboard import event, run_task


def test_hub_drops_a_slow_client_and_keeps_the_others() -> None:
    async def scenario() -> None:
        hub = Hub(client_queue_size=3)
        slow, fast = hub.subscribe("slow"), hub.subscribe("fast")
        for i in range(5):
            hub.publish("tick", {"i": i})
            await fast.queue.get()  # the fast one keeps up
        assert slow.dropped and slow not in hub.clients and hub.dropped_total == 1
        assert await slow.queue.get() is None and slow.queue.empty()  # its stream ends
        assert fast in hub.clients and not fast.dropped

    asyncio.run(scenario())


def test_flush_coalesces_changes_per_task(memory_app: Celeriac) -> None:
    async def scenario() -> None:
        monitor = Monitor(memory_app)
        client = monitor.hub.subscribe()
        first = run_task(monitor, "proj.add")
        second = run_task(monitor, "proj.div", ok=False)
        monitor.flush()
        chunk = client.queue.get_nowait()
        assert chunk is not None and chunk.startswith(b"event: tasks\ndata: ")
        data = orjson.loads(chunk.split(b"data: ", 1)[1])
        assert [t["uuid"] for t in data["tasks"]] == [first, second]  # one entry per task
        assert data["tasks"][1]["state"] == "FAILURE" and "traceback" not in data["tasks"][1]
        monitor.flush()
        assert client.queue.empty()  # nothing changed since

        for _ in range(UPDATE_BATCH + 5):
            monitor.handle(event("task-received", uuid=str(uuid.uuid4()), name="x"))
        monitor.flush()
        chunk = client.queue.get_nowait()
        assert chunk is not None
        data = orjson.loads(chunk.split(b"data: ", 1)[1])
        assert len(data["tasks"]) == UPDATE_BATCH and data["skipped"] == 5

    asyncio.run(scenario())


def test_event_stream_ends_for_a_client_that_stops_reading(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream, "WRITE_TIMEOUT", 0.2)

    async def scenario() -> None:
        hub = Hub()
        client = hub.subscribe()
        sent: list[dict[str, Any]] = []
        never = asyncio.Event()

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if len(sent) >= 3:  # the socket's buffer is full from here on
                await never.wait()

        async def receive() -> dict[str, Any]:
            await never.wait()
            return {"type": "http.disconnect"}

        response = EventStream(hub, client, b"event: tick\ndata: {}\n\n")
        task = asyncio.ensure_future(response({"type": "http"}, receive, send))
        hub.publish("tick", {"n": 1})
        hub.publish("tick", {"n": 2})
        async with asyncio.timeout(5):
            await task  # returns: the server closes the connection
        assert client not in hub.clients and hub.dropped_total == 1
        assert sent[0]["status"] == 200

    asyncio.run(scenario())


@contextlib.contextmanager
def serve(asgi: Any) -> Iterator[str]:
    server = uvicorn.Server(uvicorn.Config(asgi, host="127.0.0.1", port=0, log_level="warning",
                                           lifespan="on"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 10, message="uvicorn started")
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def sse_events(response: httpx.Response, deadline: float) -> Iterator[tuple[str, Any]]:
    """(event, data) pairs from a text/event-stream response, until ``deadline``."""
    name, data = "", b""
    for line in response.iter_lines():
        if time.monotonic() > deadline:
            raise TimeoutError("no matching server-sent event in time")
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data = line[6:].encode()
        elif line == "" and data:
            yield name, orjson.loads(data)
            name, data = "", b""


def test_events_from_the_broker_reach_the_api_and_the_stream(memory_app: Celeriac) -> None:
    with serve(create_app(memory_app)) as url, httpx.Client(base_url=url, timeout=5) as http:
        wait_until(lambda: http.get("/api/stats").json()["receiver_connected"], 10,
                   message="dashboard subscribed to events")
        dispatcher = EventDispatcher(memory_app, hostname="w9@host")
        task_id = str(uuid.uuid4())
        try:
            with http.stream("GET", "/api/events") as response:
                assert response.headers["content-type"].startswith("text/event-stream")
                events = sse_events(response, time.monotonic() + 10)
                name, first = next(events)
                assert name == "tick" and "workers" in first and "queues" in first
                dispatcher.send("worker-online", freq=2.0, active=0, processed=0,
                                loadavg=[0.0, 0.0, 0.0], sw_ident="celeriac", sw_ver="0",
                                sw_sys="Linux")
                dispatcher.send("task-received", uuid=task_id, name="proj.add",
                                args="(1, 2)", kwargs="{}", retries=0, queue="celery")
                dispatcher.send("task-failed", uuid=task_id, exception="KeyError('k')",
                                traceback="Traceback ...\nKeyError: 'k'\n", runtime=0.5)
                assert dispatcher.flush(5)
                seen: dict[str, Any] = {}
                online = False
                for name, data in events:
                    if name == "tasks":
                        seen.update((t["uuid"], t) for t in data["tasks"])
                    elif name == "tick":
                        online = online or any(w["hostname"] == "w9@host" and w["alive"]
                                               for w in data["workers"])
                    if online and seen.get(task_id, {}).get("state") == "FAILURE":
                        break
        finally:
            dispatcher.close()
        detail = http.get(f"/api/tasks/{task_id}").json()
        assert detail["state"] == "FAILURE" and detail["worker"] == "w9@host"
        assert detail["traceback"].endswith("KeyError: 'k'\n")
        wait_until(lambda: http.get("/api/stats").json()["stream_clients"] == 0, 5,
                   message="the closed stream unsubscribed")


def test_streams_opened_after_close_end_at_once() -> None:
    async def scenario() -> None:
        hub = Hub()
        before = hub.subscribe()
        hub.close()
        after = hub.subscribe()
        assert await before.queue.get() is None and await after.queue.get() is None
        assert not hub.clients

    asyncio.run(scenario())
