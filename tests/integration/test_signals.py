"""Celery's signals in a real prefork worker (-c 2) on Redis.

The worker's app module (``signals_app``) connects a receiver to each signal; every
receiver appends what it got to a Redis list of its own process, so the test sees which
process sent what, and in which order. The producer's publish signals are received here,
in the test process. Receivers are written as Sentry's and OpenTelemetry's Celery
integrations write theirs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from celeriac import Celeriac, signals
from celeriac.testing import WorkerProcess, wait_until
from tests.integration import signals_tasks as t
from tests.integration.support import bound, redis_env, workers
from tests.services import require

pytestmark = pytest.mark.slow

OK = "tests.integration.signals_tasks.ok"
Event = dict[str, Any]


@pytest.fixture
def env() -> Iterator[dict[str, str]]:
    with redis_env("sg", worker_lease_timeout=2.0) as e:
        ns = e["NAMESPACE"]
        yield {**e, "SIGNALS_KEY": f"{ns}:signals", "SIGNALS_REDIS": require("redis")}


@pytest.fixture
def ns(env: dict[str, str]) -> str:
    return env["NAMESPACE"]


@pytest.fixture
def app(env: dict[str, str]) -> Iterator[Celeriac]:
    """signals_tasks' app in this process (the producer), on the test's namespace."""
    with bound(t.app, env) as a:
        yield a


@pytest.fixture
def worker(env: dict[str, str], tmp_path: Path) -> Iterator[WorkerProcess]:
    with workers("tests.integration.signals_app", env, tmp_path) as pool:
        yield pool.start("-c", "2", "-P", "prefork")


class Recorded:
    """What the worker's receivers wrote: a list of events per pid."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.client = redis.Redis()

    def pids(self) -> set[int]:
        return {int(p) for p in self.client.smembers(f"{self.key}:pids")}

    def of(self, pid: int) -> list[Event]:
        return [json.loads(raw) for raw in self.client.lrange(f"{self.key}:pid:{pid}", 0, -1)]

    def all(self) -> dict[int, list[Event]]:
        return {pid: self.of(pid) for pid in self.pids()}

    def find(self, signal: str, **match: Any) -> list[Event]:
        return [e for events in self.all().values() for e in events
                if e["signal"] == signal and all(e.get(k) == v for k, v in match.items())]

    def wait(self, signal: str, timeout: float = 10, **match: Any) -> Event:
        found = wait_until(lambda: self.find(signal, **match), timeout,
                           message=f"{signal} {match} recorded")
        assert len(found) == 1, found
        return found[0]

    def close(self) -> None:
        self.client.close()


@pytest.fixture
def recorded(ns: str) -> Iterator[Recorded]:
    r = Recorded(f"{ns}:signals")
    yield r
    r.close()


@pytest.fixture
def published() -> Iterator[list[tuple[str, Any, dict[str, Any]]]]:
    """Publish signals received in this process, by receivers in both integrations'
    styles; the Sentry-style one adds a header, as tracing integrations do."""
    got: list[tuple[str, Any, dict[str, Any]]] = []

    def before(sender: Any = None, headers: Any = None, body: Any = None,
               **kwargs: Any) -> None:
        headers["traceparent"] = f"00-{headers['id'].replace('-', '')}-0000000000000001-01"
        got.append(("before", sender, {"headers": dict(headers), "body": body, **kwargs}))

    def after(sender: Any = None, headers: Any = None, body: Any = None,
              **kwargs: Any) -> None:
        got.append(("after", sender, {"headers": dict(headers), "body": body, **kwargs}))

    def otel_before(*args: Any, **kwargs: Any) -> None:
        got.append(("otel-before", kwargs.get("sender"), kwargs))

    signals.before_task_publish.connect(before, weak=False, dispatch_uid="test-before")
    signals.after_task_publish.connect(after, weak=False, dispatch_uid="test-after")
    signals.before_task_publish.connect(otel_before, weak=False)
    yield got
    signals.before_task_publish.disconnect(dispatch_uid="test-before")
    signals.after_task_publish.disconnect(dispatch_uid="test-after")
    signals.before_task_publish.disconnect(otel_before)


def plain(events: list[Event]) -> list[Event]:
    """The Sentry-style receivers' events (not the OpenTelemetry-style ones)."""
    return [e for e in events if not e["signal"].startswith("otel:")]


def run_of(events: list[Event], task_id: str) -> list[str]:
    """The signals a child sent for ``task_id``, prerun to postrun (per attempt)."""
    out: list[str] = []
    inside = False
    for e in plain(events):
        if e["signal"] == "task_prerun" and e["task_id"] == task_id:
            inside = True
        if inside and e["signal"] != "before_task_publish" \
                and e["signal"] != "after_task_publish":
            out.append(e["signal"])
        if e["signal"] == "task_postrun" and e["task_id"] == task_id:
            inside = False
    return out


def test_successful_task_received_prerun_success_postrun(
        app: Celeriac, worker: WorkerProcess, recorded: Recorded,
        published: list[tuple[str, Any, dict[str, Any]]]) -> None:
    r = t.ok.delay(2, y=3)
    assert r.get(timeout=10) == 5
    postrun = recorded.wait("task_postrun", task_id=r.id)

    received = recorded.wait("task_received", task_id=r.id)
    assert received["pid"] == worker.pid and received["task"] == OK
    child = postrun["pid"]
    assert child != worker.pid and postrun["ppid"] == worker.pid
    assert run_of(recorded.of(child), r.id) == ["task_prerun", "task_success", "task_postrun"]
    prerun = recorded.wait("task_prerun", task_id=r.id)
    assert prerun["pid"] == child
    assert received["t"] <= prerun["t"]
    assert prerun["task"] == prerun["sender"] == OK
    assert prerun["args"] == [2] and prerun["kwargs"] == {"y": 3}
    success = next(e for e in recorded.of(child) if e["signal"] == "task_success")
    assert success["sender"] == OK and success["result"] == 5
    assert postrun["state"] == "SUCCESS" and postrun["retval"] == "5"
    assert postrun["task"] == postrun["sender"] == OK

    # OpenTelemetry-style receivers, connected in worker_process_init, ran in the child;
    # what prerun attached to the task, postrun found.
    assert recorded.wait("otel:task_prerun", task_id=r.id)["pid"] == child
    assert recorded.wait("otel:task_postrun", task_id=r.id)["had_span"] is True

    # The producer's side, in this process: sender is the task's name, headers["id"] its id.
    assert [(kind, sender) for kind, sender, _ in published] == [
        ("before", OK), ("otel-before", OK), ("after", OK)]
    for _, _, kwargs in published:
        assert kwargs["headers"]["id"] == r.id
        assert kwargs["headers"]["task"] == OK
    before = published[0][2]
    assert before["body"][0] == [2] and before["body"][1] == {"y": 3}
    assert before["routing_key"] == "celery"
    # A header a before_task_publish receiver adds travels with the message.
    assert received["traceparent"] == before["headers"]["traceparent"]


def test_failing_task_sends_task_failure_with_exception_and_einfo(
        app: Celeriac, worker: WorkerProcess, recorded: Recorded) -> None:
    r = t.boom.delay("x", flag="f")
    with pytest.raises(ValueError, match="bad x"):
        r.get(timeout=10)
    postrun = recorded.wait("task_postrun", task_id=r.id)
    assert postrun["state"] == "FAILURE" and postrun["retval"] == "ValueError('bad x')"
    failure = recorded.wait("task_failure", task_id=r.id)
    assert failure["pid"] == postrun["pid"] != worker.pid
    assert run_of(recorded.of(failure["pid"]), r.id) == [
        "task_prerun", "task_failure", "task_postrun"]
    assert failure["sender"] == "tests.integration.signals_tasks.boom"
    assert failure["exception"] == "ValueError('bad x')"
    assert failure["exc_type"] == "ValueError"
    assert failure["args"] == ["x"] and failure["kwargs"] == {"flag": "f"}
    assert failure["einfo_is_exception"] is True and failure["einfo_type"] == "ValueError"
    assert 'raise ValueError(f"bad {value}")' in failure["einfo_traceback"]
    assert failure["has_traceback"] is True
    assert recorded.wait("otel:task_failure", task_id=r.id)["exc_type"] == "ValueError"
    assert recorded.find("task_success") == []


def test_retrying_task_sends_task_retry_then_runs_again(
        app: Celeriac, worker: WorkerProcess, recorded: Recorded) -> None:
    r = t.flaky.delay(7)
    assert r.get(timeout=15) == 7
    retry = recorded.wait("task_retry", task_id=r.id)
    assert retry["sender"] == "tests.integration.signals_tasks.flaky"
    assert retry["retries"] == 0
    assert "try again" in retry["reason"] and retry["einfo_type"] == "ConnectionError"
    assert retry["pid"] != worker.pid
    otel = recorded.wait("otel:task_retry", task_id=r.id)
    assert "try again" in otel["reason"]
    # Two runs: the first ends in a retry, the second in success.
    def two_runs() -> list[Event]:
        found = recorded.find("task_postrun", task_id=r.id)
        return found if len(found) == 2 else []

    postruns = wait_until(two_runs, 10, message="two postruns")
    assert sorted(p["state"] for p in postruns) == ["RETRY", "SUCCESS"]
    assert len(recorded.find("task_prerun", task_id=r.id)) == 2
    assert len(recorded.find("task_received", task_id=r.id)) == 2
    # The retry is published again from the child that ran it: its publish signals too.
    republished = recorded.wait("before_task_publish", task_id=r.id)
    assert republished["pid"] == retry["pid"]
    assert republished["sender"] == "tests.integration.signals_tasks.flaky"
    recorded.wait("after_task_publish", task_id=r.id)


def test_task_sent_from_a_task_publishes_from_the_child_with_its_parent(
        app: Celeriac, worker: WorkerProcess, recorded: Recorded) -> None:
    r = t.spawn.delay(4)
    inner_id = r.get(timeout=10)
    assert app.AsyncResult(inner_id).get(timeout=10) == 5
    before = recorded.wait("before_task_publish", task_id=inner_id)
    assert before["sender"] == OK and before["parent_id"] == r.id
    assert before["pid"] != worker.pid and before["ppid"] == worker.pid
    after = recorded.wait("after_task_publish", task_id=inner_id)
    assert after["pid"] == before["pid"]
    otel = recorded.wait("otel:before_task_publish", task_id=inner_id)
    assert otel["task"] == OK


def test_worker_lifecycle_signals_in_the_parent_and_each_child(
        app: Celeriac, worker: WorkerProcess, recorded: Recorded) -> None:
    def children_up() -> list[Event]:
        found = [e for e in recorded.find("worker_process_init") if e["ppid"] == worker.pid]
        return found if len(found) == 2 else []

    inits = wait_until(children_up, 10, message="worker_process_init in both children")
    children = {e["pid"] for e in inits}
    assert len(children) == 2 and worker.pid not in children
    # worker_ready comes once every step has started, which may be after both children
    # are up (the pool starts before the consumer and Gossip).
    parent = wait_until(lambda: [e["signal"] for e in recorded.of(worker.pid)]
                        if recorded.find("worker_ready") else [], 10,
                        message="worker_ready in the parent")
    assert parent[:3] == ["setup_logging", "worker_init", "worker_ready"]
    assert recorded.wait("worker_init")["hostname"]
    assert t.ok.delay(1).get(timeout=10) == 1

    assert worker.stop() == 0
    shutdown = recorded.wait("worker_shutdown", timeout=5)
    assert shutdown["pid"] == worker.pid
    assert [e["signal"] for e in recorded.of(worker.pid)][-1] == "worker_shutdown"
    for child in children:
        ends = [e for e in recorded.of(child) if e["signal"] == "worker_process_shutdown"]
        assert len(ends) == 1, recorded.of(child)
        assert ends[0]["signal_pid"] == child and ends[0]["exitcode"] == 0
    # The parent sent no child's signals, nor a child the parent's.
    assert "worker_process_init" not in [e["signal"] for e in recorded.of(worker.pid)]
    for child in children:
        assert not {"worker_init", "worker_ready", "worker_shutdown", "task_received"} & {
            e["signal"] for e in recorded.of(child)}


def test_task_handlers_see_the_running_tasks_request(
        app: Celeriac, worker: WorkerProcess, recorded: Recorded) -> None:
    """Celery sends task_prerun, task_success, task_failure and task_postrun while the
    task's request is current: receivers read ``task.request.id`` / ``sender.request.id``."""
    r = t.ok.delay(1, y=1)
    assert r.get(timeout=10) == 2
    prerun = recorded.wait("task_prerun", task_id=r.id)
    postrun = recorded.wait("task_postrun", task_id=r.id)
    success = next(e for e in recorded.of(postrun["pid"]) if e["signal"] == "task_success")
    f = t.boom.delay("y")
    with pytest.raises(ValueError):
        f.get(timeout=10)
    failure = recorded.wait("task_failure", task_id=f.id)
    assert {"prerun": prerun["request_id"], "success": success["request_id"],
            "postrun": postrun["request_id"], "failure": failure["request_id"]} == {
        "prerun": r.id, "success": r.id, "postrun": r.id, "failure": f.id}



def test_a_setup_logging_receiver_configures_the_workers_logging(
        worker: WorkerProcess, recorded: Recorded) -> None:
    """As in Celery: with a receiver on setup_logging, the worker does not configure
    logging itself; the receiver's format is the one the log shows."""
    entry = recorded.wait("setup_logging")
    assert entry["loglevel"] == "INFO" and entry["logfile"] is None
    assert entry["pid"] == worker.pid
    ready = [line for line in worker.log.splitlines() if " ready: " in line]
    assert ready and all(line.startswith("SIGNALLED ") for line in ready)
