"""Real brokers under faults: a killed worker, a restarted broker, a broker that is down.

A test that stops a broker runs its own instance on another port (never the shared one).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from celeriac import Celeriac, OperationalError, Settings
from celeriac.testing import WorkerProcess, wait_until
from tests.integration import app_tasks as t
from tests.services import IN_CI, reachable, require

pytestmark = pytest.mark.slow


def _urls(broker: str) -> tuple[str, str]:
    ns = f"f{uuid.uuid4().hex[:10]}"
    results = f"{require('redis')}?namespace={ns}r"
    if broker == "redis":
        return f"{require('redis')}?namespace={ns}", results
    return f"{require('rabbitmq')}?namespace={ns}", results


@pytest.fixture
def use(env: dict[str, str], app: Celeriac) -> Iterator[Callable[..., dict[str, str]]]:
    """Point the test's app and its workers at a broker URL and a result backend URL;
    afterwards, delete what the test left in the shared Redis."""
    used: list[str] = []

    def point(broker_url: str, backend_url: str, **extra: str) -> dict[str, str]:
        env.update(CELERIAC_BROKER_URL=broker_url, CELERIAC_RESULT_BACKEND=backend_url, **extra)
        used.extend([broker_url, backend_url])
        app.close()
        app.settings = Settings.from_env(env)
        return env

    yield point
    app.close()
    from tests.contracts.conftest import _drop_redis_namespace

    for url in used:
        if url.startswith("redis://127.0.0.1:6379/") and "namespace=" in url:
            _drop_redis_namespace(url)


@pytest.mark.parametrize("broker", ["redis", "amqp"])
def test_kill_9_of_the_whole_worker_with_1000_in_flight_loses_nothing(
        app: Celeriac, broker: str, use: Callable[..., dict[str, str]],
        start_worker: Callable[..., WorkerProcess]) -> None:
    use(*_urls(broker), CELERIAC_WORKER_PREFETCH_MULTIPLIER="500")
    results = t.sleep.delay_many([(0.005,)] * 1000)
    first = start_worker("-c", "2")
    wait_until(lambda: sum(r.ready() for r in results[:200]) >= 20, 20,
               message="the first worker is running tasks")
    first.signal(signal.SIGKILL, group=True)  # the parent and its children, no goodbye
    first.wait(5)
    start_worker("-c", "2")
    done = app.backend.wait_for([r.id for r in results], timeout=90)
    assert len(done) == 1000, f"{1000 - len(done)} tasks never completed"
    assert all(m.state == "SUCCESS" for m in done.values())


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[Callable[[], None]]:
    """A Redis of this test's own, with AOF appendfsync always; yields a restart()."""
    exe = shutil.which("redis-server")
    if exe is None:
        if IN_CI:
            pytest.fail("redis-server is not installed")
        pytest.skip("redis-server is not installed")
    port = 6390 + os.getpid() % 50
    argv = [exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path),
            "--appendonly", "yes", "--appendfsync", "always", "--save", ""]
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL))
        wait_until(lambda: reachable("127.0.0.1", port), 10, message="redis up")

    def stop() -> None:
        procs[-1].send_signal(signal.SIGTERM)  # a clean shutdown; AOF has every write
        procs[-1].wait(10)

    def restart() -> None:
        stop()
        start()

    start()
    restart.port = port  # type: ignore[attr-defined]
    restart.stop, restart.start = stop, start  # type: ignore[attr-defined]
    yield restart
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(5)


def test_redis_restart_during_5000_tasks(
        app: Celeriac, own_redis: Callable[[], None], use: Callable[..., dict[str, str]],
        start_worker: Callable[..., WorkerProcess]) -> None:
    port = own_redis.port  # type: ignore[attr-defined]
    url = f"redis://127.0.0.1:{port}/0"
    use(f"{url}?namespace=b", f"{url}?namespace=r")
    results = t.add.delay_many([(i, i) for i in range(5000)])
    w = start_worker("-c", "2")
    wait_until(lambda: results[500].ready(), 30, message="a tenth done")
    own_redis()
    done = app.backend.wait_for([r.id for r in results], timeout=120)
    assert len(done) == 5000, f"{5000 - len(done)} missing; worker log:\n{w.log[-3000:]}"
    assert all(done[r.id].result == 2 * i for i, r in enumerate(results))
    assert w.proc is not None and w.proc.poll() is None  # it reconnected by itself
    assert "connection restored" in w.log


def test_an_outage_is_two_lines_in_the_log_not_a_traceback_per_heartbeat(
        app: Celeriac, own_redis: Callable[[], None], use: Callable[..., dict[str, str]],
        start_worker: Callable[..., WorkerProcess]) -> None:
    port = own_redis.port  # type: ignore[attr-defined]
    url = f"redis://127.0.0.1:{port}/0"
    use(f"{url}?namespace=b", f"{url}?namespace=r", CELERIAC_WORKER_LEASE_TIMEOUT="1.0")
    w = start_worker("-c", "1")
    assert t.add.delay(1, 1).get(timeout=10) == 2
    own_redis.stop()  # type: ignore[attr-defined]
    # Down for several heartbeats (one every 0.25 s) and fetch retries.
    w.wait_for_log(r"lease renewal failed", 10)
    w.wait_for_log(r"retry 4 in", 30)
    own_redis.start()  # type: ignore[attr-defined]
    assert t.add.delay(2, 2).get(timeout=30) == 4
    w.wait_for_log(r"lease renewal works again after \d+\.\ds", 10)
    log = w.log
    assert log.count("lease renewal failed") == 1, log
    assert log.count("lease renewal works again") == 1, log
    assert "timer callback" not in log and "Traceback" not in log, log
    assert w.proc is not None and w.proc.poll() is None


@pytest.mark.parametrize("scheme", ["redis", "amqp"])
def test_producer_while_the_broker_is_down_raises_operational_error(scheme: str) -> None:
    url = {"redis": "redis://:secret@127.0.0.1:6399/0",
           "amqp": "amqp://guest:secret@127.0.0.1:5699//"}[scheme]
    app = Celeriac("down", broker=url, backend="memory://down",
                   broker_connection_max_retries=2)

    @app.task(name="down.add")
    def add(x: int, y: int) -> int:
        return x + y

    began = time.monotonic()
    with pytest.raises(OperationalError) as info:
        add.delay(1, 2)
    message = str(info.value)
    assert "127.0.0.1:" in message and "secret" not in message
    assert time.monotonic() - began < 30


@pytest.fixture
def own_rabbitmq(tmp_path: Path) -> Iterator[Callable[[], None]]:
    """A RabbitMQ node of this test's own on another port; yields a restart()."""
    if shutil.which("rabbitmq-server") is None or shutil.which("rabbitmqctl") is None:
        if IN_CI:
            pytest.fail("rabbitmq-server is not installed")
        pytest.skip("rabbitmq-server is not installed")
    base = Path(f"/tmp/celeriac-rmq-{os.getpid()}")
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(mode=0o755)
    port = 5690 + os.getpid() % 8
    node = f"celeriac{os.getpid()}@localhost"
    (base / "enabled_plugins").write_text("[].\n")
    (base / "rabbitmq.conf").write_text(
        f"listeners.tcp.local = 127.0.0.1:{port}\nloopback_users = none\n")
    # The server drops to the rabbitmq user: its files must be writable by it.
    shutil.chown(base, "rabbitmq")
    for p in base.iterdir():
        shutil.chown(p, "rabbitmq")
    env = {**os.environ, "RABBITMQ_NODENAME": node,
           "RABBITMQ_DIST_PORT": str(25690 + os.getpid() % 8),
           "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
           "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
           "RABBITMQ_LOG_BASE": str(base / "log"), "RABBITMQ_PID_FILE": str(base / "pid"),
           "RABBITMQ_FEATURE_FLAGS_FILE": str(base / "ff"),
           "RABBITMQ_PLUGINS_EXPAND_DIR": str(base / "plugins"),
           "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins")}

    def start() -> None:
        subprocess.run(["rabbitmq-server", "-detached"], env=env, check=True, timeout=30)
        wait_until(lambda: reachable("127.0.0.1", port), 60, interval=0.1,
                   message="own rabbitmq up")

    def stop() -> None:
        subprocess.run(["rabbitmqctl", "-n", node, "stop"], env=env, timeout=60,
                       capture_output=True)
        wait_until(lambda: not reachable("127.0.0.1", port), 30, message="rabbitmq down")

    def restart() -> None:
        stop()
        start()

    start()
    restart.port = port  # type: ignore[attr-defined]
    try:
        yield restart
    finally:
        stop()
        shutil.rmtree(base, ignore_errors=True)


def test_rabbitmq_restart_during_5000_tasks(
        app: Celeriac, own_rabbitmq: Callable[[], None], use: Callable[..., dict[str, str]],
        start_worker: Callable[..., WorkerProcess]) -> None:
    port = own_rabbitmq.port  # type: ignore[attr-defined]
    use(f"amqp://guest:guest@127.0.0.1:{port}//",
        f"{require('redis')}?namespace=rr{uuid.uuid4().hex[:8]}")
    results = t.add.delay_many([(i, i) for i in range(5000)])
    w = start_worker("-c", "2")
    wait_until(lambda: results[500].ready(), 60, message="a tenth done")
    own_rabbitmq()
    done = app.backend.wait_for([r.id for r in results], timeout=180)
    assert len(done) == 5000, f"{5000 - len(done)} missing; worker log:\n{w.log[-3000:]}"
    assert all(done[r.id].result == 2 * i for i, r in enumerate(results))
    assert w.proc is not None and w.proc.poll() is None  # it reconnected by itself
