"""Apps on two databases of one Redis server, under the same namespace, neither hear nor
command each other's workers: remote control (``inspect ping``, a broadcast command,
``shutdown``, the CLI), events (an ``EventReceiver``) and the dashboard's ``Monitor``
see their own database only. Redis pub/sub is server-wide, so this holds only because
broadcast channels name the database (``Endpoint.channel``).

Databases 1 and 3 (no other test's: ``make test`` runs the compatibility tests, which
flush theirs, beside this one), each test run under a namespace of its own (the same on
both, so the namespace alone cannot keep them apart).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import orjson
import pytest
import redis

from celeriac import Celeriac, Settings
from celeriac.clients.redis.topology import parse
from celeriac.control import merge
from celeriac.control.mailbox import REPLY_PREFIX
from celeriac.dashboard.monitor import Monitor
from celeriac.events import EventReceiver
from celeriac.testing import WorkerProcess, wait_until
from tests.contracts.conftest import _drop_redis_namespace
from tests.integration.support import ROOT
from tests.services import require

DBS = (1, 3)
MODULE = "tests.integration.app_tasks"


# -- the naming rule ----------------------------------------------------------------------
@pytest.mark.parametrize(("url", "channel"), [
    ("redis://h:6379/3", "celeriac:bc:3:celeriac.control"),
    ("redis://h:6379?db=5&namespace=x", "x:bc:5:celeriac.control"),
    ("redis://h:6379", "celeriac:bc:0:celeriac.control"),
    ("unix:///tmp/redis.sock?db=2", "celeriac:bc:2:celeriac.control"),
    ("redis+sentinel://s1:26379;s2:26379/4?master=m", "celeriac:bc:4:celeriac.control"),
    ("redis+cluster://n1:7000;n2:7001?namespace=c", "c:bc:0:celeriac.control"),
])
def test_channel_names_database_and_namespace(url: str, channel: str) -> None:
    [endpoint], _ = parse(url.split(";"), {}, "broker")  # as the settings' URL is read
    assert endpoint.channel("celeriac.control") == channel


def test_failover_urls_keep_each_database() -> None:
    endpoints, _ = parse(["redis://a:6379/1", "redis://b:6379/2"], {}, "broker")
    assert [e.channel("celeriac.events") for e in endpoints] == [
        "celeriac:bc:1:celeriac.events", "celeriac:bc:2:celeriac.events"]


# -- two workers, two databases -----------------------------------------------------------
class Side:
    """One database: its URL, worker hostname, app (the producer) and worker process."""

    def __init__(self, db: int, ns: str, tag: str) -> None:
        base = require("redis").rpartition("/")[0]
        self.url = f"{base}/{db}?namespace={ns}"
        self.host = f"{tag}@iso-{ns}"
        self.env = {"CELERIAC_BROKER_URL": self.url, "CELERIAC_RESULT_BACKEND": self.url,
                    "CELERIAC_WORKER_HEARTBEAT_INTERVAL": "0.5", "PYTHONPATH": str(ROOT)}
        self.app = Celeriac(f"iso-{tag}", settings=Settings.from_env(self.env),
                            set_as_current=False)
        self.worker = WorkerProcess(MODULE, "-n", self.host, "-P", "solo", "-E",
                                    env=self.env, cwd=str(ROOT))

    def add(self, x: int, y: int) -> Any:
        return self.app.send_task("tests.integration.app_tasks.add", (x, y))


@pytest.fixture
def sides() -> Iterator[tuple[Side, Side]]:
    ns = f"iso{uuid.uuid4().hex[:10]}"
    a, b = Side(DBS[0], ns, "a"), Side(DBS[1], ns, "b")
    try:
        for s in (a, b):
            s.worker.start(wait_ready=False)
        for s in (a, b):
            s.worker.wait_for_log(r" ready: ", 30)
        yield a, b
    finally:
        for s in (a, b):
            s.worker.kill()
            s.app.close()
            _drop_redis_namespace(s.url)


class Listening:
    """An ``EventReceiver`` and a dashboard ``Monitor`` per app, on one event loop in a
    thread of their own (what ``celeriac events`` and ``celeriac dashboard`` run)."""

    def __init__(self, apps: list[Celeriac]) -> None:
        self.apps = apps
        self.events: list[list[dict[str, Any]]] = [[] for _ in apps]
        self.monitors: list[Monitor] = []
        self.loop = asyncio.new_event_loop()
        self._ready: Future[None] = Future()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self.loop.run_until_complete,
                                        args=(self._main(),), daemon=True)

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        try:
            receivers = [EventReceiver(app) for app in self.apps]
            for r in receivers:
                await r.open()  # subscribed: what is sent from now on arrives
            self.monitors = [Monitor(app) for app in self.apps]
            for m in self.monitors:
                await m.start()
            collectors = [asyncio.ensure_future(self._collect(r, out))
                          for r, out in zip(receivers, self.events, strict=True)]
        except Exception as exc:  # the test thread raises it, from __enter__
            self._ready.set_exception(exc)
            return
        self._ready.set_result(None)
        await self._stop.wait()
        for c in collectors:
            c.cancel()
        await asyncio.gather(*collectors, return_exceptions=True)
        for m in self.monitors:
            await m.stop()
        for r in receivers:
            await r.close()

    async def _collect(self, receiver: EventReceiver, out: list[dict[str, Any]]) -> None:
        while True:
            event = await receiver.get(timeout=1.0)
            if event is not None:
                out.append(dict(event))

    def monitor_view(self, i: int) -> tuple[set[str], set[str]]:
        """Monitor ``i``'s workers and task ids, read on its loop (the only place its
        state is touched)."""
        async def read() -> tuple[set[str], set[str]]:
            m = self.monitors[i]
            return set(m.state.workers), set(m.state.tasks)
        return asyncio.run_coroutine_threadsafe(read(), self.loop).result(30)

    def __enter__(self) -> Listening:
        self._thread.start()
        try:
            self._ready.result(30)
            wait_until(lambda: all(m.connected for m in self.monitors), 30,
                       message="the monitors subscribed")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        stop = self._stop
        if stop is not None:
            self.loop.call_soon_threadsafe(stop.set)
        self._thread.join(30)
        self.loop.close()


def _finished(events: list[dict[str, Any]], task_id: str) -> bool:
    return any(e.get("type") == "task-succeeded" and e.get("uuid") == task_id
               for e in list(events))


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "celeriac", "-A", MODULE, *args],
                          env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=60, cwd=str(ROOT))


@pytest.mark.slow
def test_databases_of_one_server_are_apart(sides: tuple[Side, Side]) -> None:
    a, b = sides

    # Mingle's count of peers, and the control commands' listeners: one per database.
    for s in (a, b):
        assert s.app.transport.control_listeners() == 1  # type: ignore[attr-defined]

    # inspect ping and a broadcast command (no destination, no limit: gathered for the
    # whole timeout, so a reply from the other database would be in it).
    for s in (a, b):
        assert s.app.control.inspect(timeout=3).ping() == {s.host: {"ok": "pong"}}
        got = s.app.control.rate_limit("tests.integration.app_tasks.add", "100/s",
                                       reply=True, timeout=3)
        assert merge(got) == {s.host: {"ok": "new rate limit set successfully"}}
    # The calls' reply channels (named by the same rule) are gone with the calls.
    client = redis.Redis.from_url(a.url.partition("?")[0])
    try:
        endpoint = a.app.transport.conn.endpoint  # type: ignore[attr-defined]
        replies = endpoint.channel(REPLY_PREFIX)
        assert replies == f"{endpoint.namespace}:bc:{DBS[0]}:{REPLY_PREFIX}"
        wait_until(lambda: not client.pubsub_channels(f"{replies}*"), 10,
                   message="no reply channel left")
    finally:
        client.close()
    # The CLI, as a user types it.
    out = _cli(a.env, "inspect", "ping", "--json", "-t", "3")
    assert out.returncode == 0, out.stderr
    assert set(orjson.loads(out.stdout)) == {a.host}

    # Events and the dashboard: each database's receivers see their own worker only.
    with Listening([a.app, b.app]) as seen:
        # b's events go out first, and are in b's receiver before a's task is sent: a
        # receiver that shared b's channel would have them ahead of a's.
        b_task = b.add(1, 2)
        assert b_task.get(timeout=30) == 3
        wait_until(lambda: _finished(seen.events[1], b_task.id), 30,
                   message="b's receiver saw its task")
        wait_until(lambda: b_task.id in seen.monitor_view(1)[1], 30,
                   message="b's monitor saw its task")
        a_task = a.add(2, 3)
        assert a_task.get(timeout=30) == 5
        wait_until(lambda: _finished(seen.events[0], a_task.id), 30,
                   message="a's receiver saw its task")
        wait_until(lambda: a_task.id in seen.monitor_view(0)[1], 30,
                   message="a's monitor saw its task")
        for i, (mine, other) in enumerate(((a, b), (b, a))):
            hosts = {e.get("hostname") for e in seen.events[i]}
            assert hosts == {mine.host}, (i, hosts)
            workers, tasks = seen.monitor_view(i)
            assert workers == {mine.host}, (i, workers)
            assert (b_task if other is b else a_task).id not in tasks, (i, tasks)

    # shutdown broadcast to every worker of b's database stops b, and only b.
    got = b.app.control.shutdown(reply=True, timeout=3)
    assert merge(got) == {b.host: {"ok": "shutting down"}}
    assert b.worker.wait(30) == 0
    assert a.app.control.ping(destination=[a.host], timeout=10) == [
        {a.host: {"ok": "pong"}}]
    assert a.worker.proc is not None and a.worker.proc.poll() is None
    assert "Got shutdown from remote" not in a.worker.log, a.worker.log
