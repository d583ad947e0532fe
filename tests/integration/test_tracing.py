"""OpenTelemetry (``celeriac.contrib.opentelemetry``) and Sentry
(``celeriac.contrib.sentry``) on real workers: a prefork one (tasks in pool children) and
a threads one, each running sync and ``async def`` tasks, on SQLite files of their own.

This module is also the workers' app (``-A tests.integration.test_tracing``): with
``TRACING_OUT`` set (the workers only) it sets both up as a user would, where the app is
defined. The workers' spans go through the SDK's ``SimpleSpanProcessor`` to its
``ConsoleSpanExporter`` writing JSON lines to a file (a pool child's spans must leave its
process); their metrics are the SDK's ``InMemoryMetricReader``'s, written after each task;
their Sentry envelopes go to a transport writing a file. The test process, the producer,
traces into the SDK's ``InMemorySpanExporter`` and captures its envelopes in a list.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celeriac import Celeriac, Hooks, Settings, chain, chord, group
from celeriac.testing import WorkerProcess, wait_until

app = Celeriac("tracing", settings=Settings.from_env())


@app.task
def add(x: int, y: int) -> int:
    return x + y


@app.task
async def aadd(x: int, y: int) -> int:
    await asyncio.sleep(0)  # sleep-ok: a real await, so the task is truly async
    return x + y


@app.task
def tsum(values: list[int]) -> int:
    return sum(values)


@app.task
def boom(n: int, password: str = "") -> None:
    raise KeyError(f"boom {n}")


@app.task
async def aboom(n: int) -> None:
    await asyncio.sleep(0)  # sleep-ok: a real await, so the task is truly async
    raise KeyError(f"aboom {n}")


@app.task(bind=True, max_retries=3)
def flaky(self: Any, n: int) -> int:
    if self.request.retries < 2:
        raise self.retry(exc=ValueError("not yet"), countdown=0.05)
    return n


@app.task(bind=True, max_retries=1)
def always_retry(self: Any, n: int) -> None:
    raise self.retry(exc=KeyError(f"still broken {n}"), countdown=0.05)


class MetricsFile(Hooks):
    """After each task, the process's metrics as the in-memory reader has them, in
    ``metrics-<pid>.json`` (replaced whole: a reader sees one snapshot or the next)."""

    def __init__(self, reader: Any, out: str) -> None:
        self.reader, self.out = reader, out
        self.lock = threading.Lock()

    def after_task(self, request: Any, state: str, retval: Any) -> None:
        with self.lock:
            snapshot = self.reader.get_metrics_data()
            if snapshot is None:
                return
            data = snapshot.to_json(indent=None)
            path = Path(self.out, f"metrics-{os.getpid()}.json")
            tmp = path.with_suffix(f".{threading.get_ident()}.tmp")
            tmp.write_text(data)
            os.replace(tmp, path)


def _set_up_worker(out: str) -> None:
    """What a user writes beside the app, in the workers."""
    import sentry_sdk
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
    from sentry_sdk.transport import Transport

    from celeriac.contrib.opentelemetry import CeleriacInstrumentor
    from celeriac.contrib.sentry import CeleriacIntegration

    spans = open(Path(out, "spans.jsonl"), "a")  # noqa: SIM115 (the process's lifetime)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(
        out=spans, formatter=lambda span: span.to_json(indent=None) + "\n")))
    trace.set_tracer_provider(provider)
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    CeleriacInstrumentor().instrument(app=app)
    app.add_hooks(MetricsFile(reader, out))

    class FileTransport(Transport):
        def capture_envelope(self, envelope: Any) -> None:
            lines = "".join(json.dumps({"type": item.type, "payload": item.payload.json,
                                        "pid": os.getpid()}) + "\n"
                            for item in envelope.items)
            fd = os.open(Path(out, "envelopes.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            try:
                os.write(fd, lines.encode())
            finally:
                os.close(fd)

    sentry_sdk.init(dsn="https://public@sentry.invalid/1", transport=FileTransport,
                    integrations=[CeleriacIntegration()], traces_sample_rate=1.0,
                    auto_enabling_integrations=False)  # celery, django...: slow to load


if os.environ.get("TRACING_OUT"):
    _set_up_worker(os.environ["TRACING_OUT"])


# -- the tests -------------------------------------------------------------------------

ROOT = Path(__file__).parent.parent.parent
POOLS = ("prefork", "threads")


class Worker:
    """A worker process, its environment and what it wrote to ``out``."""

    def __init__(self, process: WorkerProcess, env: dict[str, str], out: Path) -> None:
        self.process, self.env, self.out = process, env, out

    def _lines(self, name: str) -> list[dict[str, Any]]:
        path = self.out / name
        if not path.exists():
            return []
        # The last line may be being written: only whole lines count.
        return [json.loads(line) for line in path.read_text().split("\n")[:-1] if line]

    def spans(self) -> list[dict[str, Any]]:
        return self._lines("spans.jsonl")

    def envelope_items(self) -> list[dict[str, Any]]:
        return self._lines("envelopes.jsonl")

    def metrics(self) -> list[dict[str, Any]]:
        """Every data point of every process, with its metric's name."""
        points = []
        for path in self.out.glob("metrics-*.json"):
            data = json.loads(path.read_text())
            for rm in data["resource_metrics"]:
                for sm in rm["scope_metrics"]:
                    for metric in sm["metrics"]:
                        for point in metric["data"]["data_points"]:
                            points.append({"name": metric["name"], **point})
        return points


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Worker]]:
    """A prefork worker and a threads one (-c 2), started together, shared by the tests."""
    started: dict[str, Worker] = {}
    try:
        for pool in POOLS:
            base = tmp_path_factory.mktemp(f"tracing-{pool}")
            out = base / "out"
            out.mkdir()
            env = {"CELERIAC_BROKER_URL": f"sqlite:///{base}/celeriac.db",
                   "PYTHONPATH": str(ROOT), "TRACING_OUT": str(out)}
            process = WorkerProcess("tests.integration.test_tracing", "-c", "2", "-P", pool,
                                    env=env, cwd=str(base))
            started[pool] = Worker(process.start(wait_ready=False), env, out)
        for worker in started.values():
            worker.process.wait_for_log(r" ready: ", 30)
        yield started
    finally:
        for worker in started.values():
            worker.process.kill()


@pytest.fixture(params=POOLS)
def worker(request: pytest.FixtureRequest, workers: dict[str, Worker]) -> Iterator[Worker]:
    """One of the workers, and this module's app pointed at its broker."""
    chosen = workers[request.param]
    before = app.settings
    app.close()
    app.settings = Settings.from_env(chosen.env)
    try:
        yield chosen
    finally:
        app.close()
        app.settings = before
    log = chosen.process.log
    assert " failed" not in "\n".join(line for line in log.splitlines() if "hook" in line), log


def test_nothing_of_either_is_imported_when_they_are_off() -> None:
    code = (
        "import sys\n"
        "from celeriac import Celeriac, chain\n"
        "app = Celeriac('off', broker='memory://off')\n"
        "@app.task\n"
        "def add(x, y):\n"
        "    return x + y\n"
        "assert chain(add.s(1, 2), add.s(3)).apply().get() == 6\n"
        "add.delay(1, 2)\n"
        "found = sorted(m for m in sys.modules\n"
        "               if m.split('.')[0] in ('opentelemetry', 'sentry_sdk'))\n"
        "print(found)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"



def test_an_eager_call_runs_in_its_callers_span_until_uninstrumented() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from celeriac.contrib.opentelemetry import CeleriacInstrumentor

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    local = Celeriac("tracing-eager", broker="memory://tracing-eager")

    @local.task
    def double(x: int) -> int:
        return 2 * x

    instrumentor = CeleriacInstrumentor()
    installed = instrumentor.instrument(tracer_provider=provider)  # every app of the process
    assert CeleriacInstrumentor().instrument() is installed  # once: no second span each
    try:
        with provider.get_tracer("caller").start_as_current_span("caller") as caller:
            assert double.apply((2,)).get() == 4
    finally:
        instrumentor.uninstrument()
    (run,) = [s for s in exporter.get_finished_spans() if s.name.startswith("run ")]
    assert run.name == f"run {double.name}"
    assert run.parent is not None
    assert run.parent.span_id == caller.get_span_context().span_id
    exporter.clear()
    assert double.apply((3,)).get() == 6
    assert exporter.get_finished_spans() == ()
    local.close()
    provider.shutdown()

# -- OpenTelemetry -----------------------------------------------------------------------

@pytest.fixture
def otel(worker: Worker) -> Iterator[tuple[Any, Any]]:
    """The producer's tracer (this process: the web app) and its in-memory exporter."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from celeriac.contrib.opentelemetry import CeleriacInstrumentor

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = CeleriacInstrumentor()
    instrumentor.instrument(app=app, tracer_provider=provider)
    try:
        yield provider.get_tracer("web"), exporter
    finally:
        instrumentor.uninstrument(app=app)
        provider.shutdown()


def _spans(worker: Worker, exporter: Any, ids: set[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """The spans of ``ids`` by operation (publish, receive, run), then by task id, once
    every id has all three (the producer's and the workers' together)."""

    def collect() -> dict[str, dict[str, dict[str, Any]]] | None:
        found: dict[str, dict[str, dict[str, Any]]] = {"publish": {}, "receive": {}, "run": {}}
        mine = [json.loads(s.to_json(indent=None)) for s in exporter.get_finished_spans()]
        for span in mine + worker.spans():
            task_id = span["attributes"].get("messaging.message.id")
            operation = span["attributes"].get("messaging.operation.name")
            if task_id in ids and operation in found:
                found[operation][task_id] = span
        return found if all(len(by_id) == len(ids) for by_id in found.values()) else None

    return wait_until(collect, 20, message="every span of the workflow")


@pytest.mark.slow
def test_one_trace_runs_from_a_request_through_a_chain_a_chord_and_a_group(
        worker: Worker, otel: tuple[Any, Any]) -> None:
    from opentelemetry.trace import SpanKind, format_span_id, format_trace_id

    tracer, exporter = otel
    with tracer.start_as_current_span("GET /checkout", kind=SpanKind.SERVER) as root:
        steps = chain(add.s(1, 2), aadd.s(3), add.s(4)).apply_async()
        body = chord([add.s(i, i) for i in range(3)], tsum.s()).apply_async()
        members = group(aadd.s(i, 1) for i in range(2)).apply_async()
    assert steps.get(timeout=20) == 10
    assert body.get(timeout=20) == 6
    assert members.get(timeout=20) == [1, 2]
    assert steps.parent is not None and steps.parent.parent is not None
    chained = [steps.parent.parent.id, steps.parent.id, steps.id]
    assert body.parent is not None
    header = [r.id for r in body.parent.results]
    grouped = [r.id for r in members.results]
    ids = {*chained, *header, body.id, *grouped}
    spans = _spans(worker, exporter, ids)
    publish, receive, run = spans["publish"], spans["receive"], spans["run"]

    trace_id = f"0x{format_trace_id(root.get_span_context().trace_id)}"
    root_id = f"0x{format_span_id(root.get_span_context().span_id)}"
    assert {s["context"]["trace_id"] for by_id in spans.values() for s in by_id.values()} \
        == {trace_id}
    for task_id in ids:  # each message's receive and run are its publish's children
        sent = publish[task_id]["context"]["span_id"]
        assert receive[task_id]["parent_id"] == sent
        assert run[task_id]["parent_id"] == sent
        assert publish[task_id]["kind"] == "SpanKind.PRODUCER"
        assert receive[task_id]["kind"] == "SpanKind.CLIENT"
        assert run[task_id]["kind"] == "SpanKind.CONSUMER"
    # What the request sent is its child; what a task sent after it, that task's run's.
    for task_id in (chained[0], *header, *grouped):
        assert publish[task_id]["parent_id"] == root_id
    assert publish[chained[1]]["parent_id"] == run[chained[0]]["context"]["span_id"]
    assert publish[chained[2]]["parent_id"] == run[chained[1]]["context"]["span_id"]
    assert publish[body.id]["parent_id"] in {run[h]["context"]["span_id"] for h in header}

    step = run[chained[1]]
    assert step["name"] == "run tests.integration.test_tracing.aadd"
    assert step["attributes"]["messaging.system"] == "celeriac"
    assert step["attributes"]["messaging.operation.type"] == "process"
    assert step["attributes"]["messaging.destination.name"] == "celery"
    assert step["attributes"]["messaging.message.conversation_id"] == chained[0]
    assert step["status"]["status_code"] == "UNSET"


@pytest.mark.slow
def test_a_failure_marks_its_run_span_and_the_metrics_count_runs_and_waits(
        worker: Worker, otel: tuple[Any, Any]) -> None:
    _, exporter = otel
    failing, afailing = boom.delay(1), aboom.delay(2)
    assert add.delay(2, 2).get(timeout=20) == 4
    for result in (failing, afailing):
        with pytest.raises(KeyError):
            result.get(timeout=20)
    run = _spans(worker, exporter, {failing.id, afailing.id})["run"]
    for task_id in (failing.id, afailing.id):
        span = run[task_id]
        assert span["status"]["status_code"] == "ERROR"
        assert span["attributes"]["error.type"] == "KeyError"
        assert span["attributes"]["celeriac.task.state"] == "FAILURE"
        assert [e["name"] for e in span["events"]] == ["exception"]

    name = "tests.integration.test_tracing."

    def counted() -> list[dict[str, Any]] | None:
        points = worker.metrics()

        def total(metric: str, field: str, **attributes: str) -> float:
            return sum(p[field] for p in points if p["name"] == metric and all(
                p["attributes"].get(k) == v for k, v in attributes.items()))

        facts = [
            total("celeriac.task.runs", "value", **{"celeriac.task.name": name + "add",
                                                   "celeriac.task.state": "SUCCESS"}),
            total("celeriac.task.failures", "value", **{"celeriac.task.name": name + "boom",
                                                       "error.type": "KeyError"}),
            total("celeriac.task.failures", "value", **{"celeriac.task.name": name + "aboom"}),
            total("messaging.process.duration", "count",
                  **{"celeriac.task.name": name + "add"}),
            total("celeriac.task.queue_wait", "count", **{"celeriac.task.name": name + "add"}),
        ]
        return points if all(f >= 1 for f in facts) else None

    points = wait_until(counted, 20, message="the task metrics")
    durations = [p for p in points if p["name"] == "messaging.process.duration"]
    assert all(p["sum"] >= 0 and p["attributes"]["messaging.system"] == "celeriac"
               for p in durations)


# -- Sentry ------------------------------------------------------------------------------

@pytest.fixture
def sentry(worker: Worker) -> Iterator[list[dict[str, Any]]]:
    """Sentry in this process (the producer) with a transport capturing its envelopes'
    items; the integration's hooks uninstalled after."""
    import sentry_sdk
    from sentry_sdk.transport import Transport

    from celeriac import hooks
    from celeriac.contrib.sentry import HOOKS, CeleriacIntegration

    captured: list[dict[str, Any]] = []

    class ListTransport(Transport):
        def capture_envelope(self, envelope: Any) -> None:
            captured.extend({"type": item.type, "payload": item.payload.json}
                            for item in envelope.items)

    sentry_sdk.init(dsn="https://public@sentry.invalid/1", transport=ListTransport,
                    integrations=[CeleriacIntegration()], default_integrations=False,
                    auto_enabling_integrations=False, traces_sample_rate=1.0)
    hooks.add_global(HOOKS)  # setup_once runs once per process: a second test needs this
    try:
        yield captured
    finally:
        hooks.remove_global(HOOKS)
        sentry_sdk.get_client().close()
        sentry_sdk.get_global_scope().set_client(None)


def _of(items: list[dict[str, Any]], kind: str, task_id: str) -> list[dict[str, Any]]:
    return [i["payload"] for i in items if i["type"] == kind
            and (i["payload"].get("tags") or {}).get("celery_task_id") == task_id]


def _transactions(items: list[dict[str, Any]], task_id: str) -> list[dict[str, Any]]:
    """The worker's transactions of ``task_id``'s runs (its id is on their process span)."""
    return [i["payload"] for i in items if i["type"] == "transaction"
            and any(s["op"] == "queue.process"
                    and s["data"].get("messaging.message.id") == task_id
                    for s in i["payload"].get("spans", ()))]


@pytest.mark.slow
def test_a_failing_task_is_reported_once_with_its_job_in_the_producers_trace(
        worker: Worker, sentry: list[dict[str, Any]]) -> None:
    import sentry_sdk

    with sentry_sdk.start_transaction(op="http.server", name="GET /checkout") as request:
        failing = boom.delay(7, password="hunter2")
        afailing = aboom.delay(8)
        retried = flaky.delay(5)
        exhausted = always_retry.delay(9)
    assert retried.get(timeout=20) == 5
    for result in (failing, afailing, exhausted):
        with pytest.raises(KeyError):
            result.get(timeout=20)
    wait_until(lambda: all(_transactions(worker.envelope_items(), r.id)
                           for r in (failing, afailing, exhausted)), 20,
               message="the runs' transactions")
    items = worker.envelope_items()

    # Reported once each (not also through the log lines of the failure), ...
    for result in (failing, afailing, exhausted):
        assert len(_of(items, "event", result.id)) == 1, _of(items, "event", result.id)
    # (every event of the worker is a task's: not one of its failure log lines) ...
    events = [i["payload"] for i in items if i["type"] == "event"]
    assert all((e.get("tags") or {}).get("celery_task_id") for e in events), events
    # ... the retried runs not at all: only a final failure is.
    assert _of(items, "event", retried.id) == []
    assert sorted(t["contexts"]["trace"]["status"] for t in _transactions(items, retried.id)
                  ) == ["aborted", "aborted", "ok"]

    event = _of(items, "event", failing.id)[0]
    job = event["extra"]["celery-job"]
    assert job["task_name"] == "tests.integration.test_tracing.boom"
    assert job["task_id"] == failing.id
    assert job["kwargs"] == {"password": "[Filtered]"}  # the client's scrubber
    assert job["args"] == "[Filtered]"  # positional: only with send_default_pii
    assert job["retries"] == 0 and job["queue"] == "celery"
    exception = event["exception"]["values"][-1]
    assert exception["type"] == "KeyError"
    assert exception["mechanism"] == {"type": "celeriac", "handled": False}
    assert _of(items, "event", exhausted.id)[0]["extra"]["celery-job"]["retries"] == 1

    # The trace goes on from the producer's transaction (its publish spans), through
    # the worker's.
    (sent,) = [i["payload"] for i in sentry if i["type"] == "transaction"]
    assert sent["transaction"] == "GET /checkout"
    published = {span["data"]["messaging.message.id"]: span for span in sent["spans"]
                 if span["op"] == "queue.publish"}
    assert published.keys() == {failing.id, afailing.id, retried.id, exhausted.id}
    trace_id = request.trace_id
    for result, name in ((failing, boom.name), (afailing, aboom.name)):
        publish = published[result.id]
        assert publish["parent_span_id"] == request.span_id
        assert publish["data"]["messaging.destination.name"] == "celery"
        assert _of(items, "event", result.id)[0]["contexts"]["trace"]["trace_id"] == trace_id
        (run,) = _transactions(items, result.id)
        assert run["contexts"]["trace"]["trace_id"] == trace_id
        assert run["contexts"]["trace"]["parent_span_id"] == publish["span_id"]
        assert run["contexts"]["trace"]["op"] == "queue.task.celeriac"
        assert run["transaction"] == name
        (process,) = [s for s in run["spans"] if s["op"] == "queue.process"]
        assert process["data"]["messaging.message.id"] == result.id
        assert process["data"]["messaging.message.receive.latency"] >= 0
