"""The dashboard's HTTP API, auth, /metrics and CLI checks, fed synthetic events."""

from __future__ import annotations

import asyncio
import base64
import itertools
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from celeriac import Celeriac
from celeriac.cli import main
from celeriac.dashboard import create_app
from celeriac.dashboard.monitor import Monitor, Throughput
from celeriac.dashboard.security import host_of
from celeriac.events import ClusterState

with warnings.catch_warnings():  # this starlette asks for httpx2, which is not installed
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

_clock = itertools.count(1)


def event(type_: str, hostname: str = "w1@host", **fields: Any) -> dict[str, Any]:
    """An event as a worker sends it (see the events contract)."""
    return {"type": type_, "hostname": hostname, "pid": 100, "utcoffset": 0,
            "timestamp": time.time(), "clock": next(_clock), **fields}


def worker_online(hostname: str = "w1@host") -> dict[str, Any]:
    return event("worker-online", hostname, freq=2.0, active=1, processed=7,
                 loadavg=[0.5, 0.25, 0.125], sw_ident="celeriac", sw_ver="0.1",
                 sw_sys="Linux")


def run_task(monitor: Monitor, name: str, *, ok: bool = True, hostname: str = "w1@host",
             queue: str = "celery", runtime: float = 0.02) -> str:
    task_id = str(uuid.uuid4())
    monitor.handle(event("task-received", hostname, uuid=task_id, name=name, args="(1, 2)",
                         kwargs="{'x': '<b>'}", retries=0, eta=None, expires=None,
                         queue=queue, root_id=task_id, parent_id=None))
    monitor.handle(event("task-started", hostname, uuid=task_id))
    if ok:
        monitor.handle(event("task-succeeded", hostname, uuid=task_id, result="3",
                             runtime=runtime))
    else:
        monitor.handle(event("task-failed", hostname, uuid=task_id,
                             exception="ValueError('bad value')",
                             traceback='Traceback (most recent call last):\n  File "t.py"'
                                       "\nValueError: bad value\n", runtime=runtime))
    return task_id


@pytest.fixture
def web(memory_app: Celeriac) -> Iterator[TestClient]:
    app = create_app(memory_app, queues=["extra"], receive_events=False)
    with TestClient(app) as client:
        yield client


def monitor_of(client: TestClient) -> Monitor:
    monitor: Monitor = client.app.state.monitor  # type: ignore[attr-defined]
    return monitor


def test_workers(web: TestClient) -> None:
    m = monitor_of(web)
    m.handle(worker_online("w1@host"))
    m.handle(worker_online("w2@host"))
    m.handle(event("worker-offline", "w2@host", freq=2.0, active=0, processed=7,
                   loadavg=[0, 0, 0]))
    workers = {w["hostname"]: w for w in web.get("/api/workers").json()["workers"]}
    assert workers["w1@host"]["status"] == "online" and workers["w1@host"]["alive"] is True
    assert workers["w1@host"]["active"] == 1 and workers["w1@host"]["processed"] == 7
    assert workers["w1@host"]["loadavg"] == [0.5, 0.25, 0.125]
    assert workers["w2@host"]["status"] == "offline"


def test_worker_goes_offline_when_heartbeats_stop(memory_app: Celeriac) -> None:
    now = [1000.0]
    state = ClusterState(clock=lambda: now[0])
    client = TestClient(create_app(memory_app, state=state, receive_events=False))
    state.event({**worker_online(), "timestamp": 1000.0, "local_received": 1000.0})
    assert client.get("/api/workers").json()["workers"][0]["status"] == "online"
    now[0] = 1005.0  # freq 2.0: expired after 4 s without a heartbeat
    assert client.get("/api/workers").json()["workers"][0]["status"] == "offline"


def test_tasks_list_filters_and_limit(web: TestClient) -> None:
    m = monitor_of(web)
    ok = [run_task(m, "proj.add") for _ in range(3)]
    failed = run_task(m, "proj.div", ok=False, hostname="w2@host")
    running = str(uuid.uuid4())
    m.handle(event("task-received", uuid=running, name="proj.add", args="()", kwargs="{}"))

    data = web.get("/api/tasks").json()
    assert data["total"] == 5 and data["matched"] == 5
    assert data["tasks"][0]["uuid"] == running  # most recently updated first
    assert "traceback" not in data["tasks"][0]  # lists leave it to the detail view

    def ids(**params: str) -> set[str]:
        return {t["uuid"] for t in web.get("/api/tasks", params=params).json()["tasks"]}

    assert ids(state="SUCCESS") == set(ok)
    assert ids(state="failure") == {failed}  # case-insensitive
    assert ids(state="RECEIVED") == {running}
    assert ids(name="proj.add") == {*ok, running}
    assert ids(worker="w2@host") == {failed}
    assert ids(name="proj.add", state="SUCCESS", worker="w1@host") == set(ok)
    assert ids(name="proj.add", worker="w2@host") == set()
    limited = web.get("/api/tasks", params={"state": "SUCCESS", "limit": "2"}).json()
    assert len(limited["tasks"]) == 2 and limited["matched"] == 3
    assert web.get("/api/tasks", params={"limit": "x"}).status_code == 400
    assert web.get("/api/tasks", params={"limit": "0"}).status_code == 400


def test_task_detail(web: TestClient) -> None:
    m = monitor_of(web)
    failed = run_task(m, "proj.div", ok=False, runtime=0.25)
    t = web.get(f"/api/tasks/{failed}").json()
    assert t["state"] == "FAILURE" and t["name"] == "proj.div" and t["worker"] == "w1@host"
    assert t["exception"] == "ValueError('bad value')"
    assert t["traceback"].startswith("Traceback (most recent call last)")
    assert t["args"] == "(1, 2)" and t["kwargs"] == "{'x': '<b>'}"
    assert t["runtime"] == 0.25 and t["retries"] == 0 and t["queue"] == "celery"
    assert t["received"] <= t["started"] <= t["failed"] == t["finished"]
    assert t["updated"] == t["failed"]
    missing = web.get(f"/api/tasks/{uuid.uuid4()}")
    assert missing.status_code == 404 and "error" in missing.json()


def test_queues_default_seen_and_given(web: TestClient, memory_app: Celeriac) -> None:
    m = monitor_of(web)
    run_task(m, "proj.add", queue="images")
    memory_app.send_task("proj.add", args=(1, 2))
    memory_app.send_task("proj.add", args=(1, 2), queue="images")
    memory_app.send_task("proj.add", args=(1, 2), queue="images")
    queues = {q["name"]: q["length"] for q in web.get("/api/queues").json()["queues"]}
    assert queues == {"celery": 1, "images": 2, "extra": 0}
    assert web.get("/api/queues").json()["queues"][0]["name"] == "celery"  # default first


def test_stats(web: TestClient) -> None:
    m = monitor_of(web)
    m.handle(worker_online())
    run_task(m, "proj.add")
    run_task(m, "proj.add")
    run_task(m, "proj.div", ok=False)
    s = web.get("/api/stats").json()
    assert s["counts"] == {"SUCCESS": 2, "FAILURE": 1}
    assert s["workers"] == {"total": 1, "online": 1}
    assert s["events"] == 10 and s["tasks_in_memory"] == 3
    assert sum(b[1] for b in s["throughput"]) == 2 and sum(b[2] for b in s["throughput"]) == 1
    assert {"name": "proj.div", "state": "FAILURE", "count": 1} in s["finished"]
    assert s["cluster"]["totals"]["SUCCESS"] == 2


def test_bad_events_are_skipped(web: TestClient) -> None:
    m = monitor_of(web)
    m.handle({"type": "task-received", "uuid": 5})  # not a valid uuid: ignored by the state
    m.handle({"no": "type"})
    run_task(m, "proj.add")
    assert web.get("/api/tasks").json()["total"] == 1


def test_metrics(web: TestClient, memory_app: Celeriac) -> None:
    m = monitor_of(web)
    m.handle(worker_online("w1@host"))
    run_task(m, "proj.add", runtime=0.02)
    run_task(m, "proj.add", runtime=3.0)
    run_task(m, "proj.div", ok=False, runtime=0.2)
    memory_app.send_task("proj.add")
    response = web.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in families.values() for s in f.samples}

    assert samples["celeriac_tasks", (("name", "proj.add"), ("state", "SUCCESS"))] == 2
    assert samples["celeriac_tasks", (("name", "proj.div"), ("state", "FAILURE"))] == 1
    assert samples["celeriac_tasks_finished_total",
                   (("name", "proj.div"), ("state", "FAILURE"))] == 1
    assert families["celeriac_task_runtime_seconds"].type == "histogram"
    assert samples["celeriac_task_runtime_seconds_count", (("name", "proj.add"),)] == 2
    assert samples["celeriac_task_runtime_seconds_sum", (("name", "proj.add"),)] == 3.02
    assert samples["celeriac_task_runtime_seconds_bucket",
                   (("le", "0.025"), ("name", "proj.add"))] == 1
    assert samples["celeriac_task_runtime_seconds_bucket",
                   (("le", "+Inf"), ("name", "proj.add"))] == 2
    assert samples["celeriac_queue_length", (("queue", "celery"),)] == 1
    assert samples["celeriac_queue_length", (("queue", "extra"),)] == 0
    assert samples["celeriac_worker_up", (("hostname", "w1@host"),)] == 1
    assert samples["celeriac_workers_online", ()] == 1
    assert samples["celeriac_worker_active_tasks", (("hostname", "w1@host"),)] == 1
    assert samples["celeriac_events_received_total", ()] == 10


def test_metrics_registries_are_per_app(memory_app: Celeriac) -> None:
    # Two dashboards in one process must not collide in prometheus' global registry.
    a = TestClient(create_app(memory_app, receive_events=False))
    b = TestClient(create_app(memory_app, receive_events=False))
    monitor_of(a).handle(worker_online())
    assert "celeriac_worker_up{" in a.get("/metrics").text
    assert "celeriac_worker_up{" not in b.get("/metrics").text


def test_page_and_assets(web: TestClient) -> None:
    page = web.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "static/dashboard.js" in page.text and "http" not in page.text.split("<body>")[0]
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"
    js = web.get("/static/dashboard.js")
    assert js.status_code == 200 and "javascript" in js.headers["content-type"]
    assert "innerHTML" not in js.text and "insertAdjacentHTML" not in js.text
    assert web.get("/static/dashboard.css").status_code == 200
    assert web.get("/static/../web.py").status_code == 404
    assert web.get("/static/nope.js").status_code == 404
    cached = web.get("/static/dashboard.css", headers={"if-none-match": js.headers["etag"]})
    assert cached.status_code == 200
    again = web.get("/static/dashboard.js", headers={"if-none-match": js.headers["etag"]})
    assert again.status_code == 304


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


@pytest.mark.parametrize("path", ["/", "/static/dashboard.js", "/api/workers", "/api/tasks",
                                  "/api/queues", "/api/stats", "/metrics", "/api/events"])
def test_basic_auth_on_every_route(memory_app: Celeriac, path: str) -> None:
    client = TestClient(create_app(memory_app, auth=("admin", "s3cret"),
                                   receive_events=False))
    denied = client.get(path)
    assert denied.status_code == 401
    assert denied.headers["www-authenticate"].startswith("Basic realm=")
    assert "s3cret" not in denied.text
    assert client.get(path, headers=basic("admin", "wrong")).status_code == 401
    assert client.get(path, headers=basic("other", "s3cret")).status_code == 401
    assert client.get(path, headers={"Authorization": "Basic !!!"}).status_code == 401
    assert client.get(path, headers={"Authorization": "Bearer x"}).status_code == 401
    if path != "/api/events":  # a stream never ends; its auth is what is under test
        assert client.get(path, headers=basic("admin", "s3cret")).status_code == 200


def test_password_with_colon(memory_app: Celeriac) -> None:
    client = TestClient(create_app(memory_app, auth=("admin", "a:b"), receive_events=False))
    assert client.get("/api/stats", headers=basic("admin", "a:b")).status_code == 200


def test_host_check(memory_app: Celeriac) -> None:
    client = TestClient(create_app(memory_app, receive_events=False,
                                   allowed_hosts=["127.0.0.1", "localhost", "::1"]))
    assert client.get("/api/stats", headers={"host": "127.0.0.1:5555"}).status_code == 200
    assert client.get("/api/stats", headers={"host": "[::1]:5555"}).status_code == 200
    assert client.get("/api/stats", headers={"host": "localhost"}).status_code == 200
    assert client.get("/api/stats", headers={"host": "evil.example:5555"}).status_code == 421
    assert host_of("[::1]") == "::1" and host_of("Example.COM:80") == "example.com"


def test_throughput_buckets_fill_gaps() -> None:
    now = [100.2]
    tp = Throughput(seconds=5, clock=lambda: now[0])
    tp.record(succeeded=1)
    now[0] = 102.5
    tp.record(failed=1)
    tp.record(succeeded=1)
    assert tp.series() == [[100, 1, 0], [101, 0, 0], [102, 1, 1]]
    now[0] = 200.0  # a long gap: the old buckets are gone, not zero-filled by the hundred
    assert tp.series() == [[200, 0, 0]]


# -- the command line ------------------------------------------------------------------

@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "::", "example.com"])
def test_cli_refuses_public_bind_without_auth(host: str, monkeypatch: pytest.MonkeyPatch
                                              ) -> None:
    monkeypatch.delenv("CELERIAC_DASHBOARD_AUTH", raising=False)
    result = CliRunner().invoke(main, ["dashboard", "--host", host])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert "refusing to listen" in lines[0] and "--basic-auth" in lines[0]
    assert "--insecure-bind" in lines[0]


def test_cli_rejects_malformed_auth_without_echoing_it(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    monkeypatch.delenv("CELERIAC_DASHBOARD_AUTH", raising=False)
    result = CliRunner().invoke(main, ["dashboard", "--basic-auth", "justapassword"])
    assert result.exit_code == 2 and "USER:PASSWORD" in result.output
    assert "justapassword" not in result.output


def test_cli_is_loopback() -> None:
    from celeriac.cli.dashboard import is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert is_loopback("127.0.0.2") and is_loopback("[::1]")
    assert not is_loopback("0.0.0.0") and not is_loopback("") and not is_loopback("host")


def test_a_queue_that_cannot_be_read(web: TestClient, memory_app: Celeriac,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    real = memory_app.transport.queue_length

    def queue_length(queue: str) -> int:
        if queue == "extra":
            raise ConnectionError("broker said no")
        return real(queue)

    monkeypatch.setattr(memory_app.transport, "queue_length", queue_length)
    queues = {q["name"]: q for q in web.get("/api/queues").json()["queues"]}
    assert queues["celery"] == {"name": "celery", "length": 0, "error": None}
    assert queues["extra"]["length"] is None
    assert queues["extra"]["error"] == "ConnectionError: broker said no"
    text = web.get("/metrics").text
    assert 'celeriac_queue_length{queue="celery"} 0.0' in text
    assert 'queue="extra"' not in text  # no sample rather than a wrong one


def test_a_slow_broker_does_not_hang_queue_reads(memory_app: Celeriac,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()

    def queue_length(queue: str) -> int:
        release.wait(5)
        return 7

    async def scenario() -> None:
        monitor = Monitor(memory_app)
        monkeypatch.setattr(memory_app.transport, "queue_length", queue_length)
        started = time.monotonic()
        first = await monitor.refresh_queues(timeout=0.1)
        assert time.monotonic() - started < 2
        assert first == [{"name": "celery", "length": None, "error": None}]  # nothing yet
        release.set()
        assert (await monitor.refresh_queues(timeout=5))[0]["length"] == 7

    asyncio.run(scenario())


def test_missing_dependencies_name_the_extra(memory_app: Celeriac,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from celeriac.errors import ConfigurationError

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ConfigurationError, match=r"prometheus_client: pip install "
                                                 r"'celeriac\[dashboard\]'"):
        create_app(memory_app)
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    result = CliRunner().invoke(main, ["dashboard"])
    assert result.exit_code == 1
    assert "pip install 'celeriac[dashboard]'" in result.output
    assert len(result.output.strip().splitlines()) == 1
