"""Remote control with three real workers on Redis and on RabbitMQ (results on Redis).

One test per broker shares its workers across the checks (starting workers is what
costs): replies from all three, ``limit`` returning early, a busy worker answering
``ping``, revoke before start, revoke with terminate on prefork (not redelivered),
pool_grow/shrink, rate_limit, shutdown of one named worker, revoke remembered across a
restart (statedb) and by a worker started later (the broker's store), and the CLI.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from celeriac import Celeriac, states
from celeriac.control import merge
from celeriac.errors import TaskRevoked
from celeriac.testing import WorkerProcess, wait_until
from tests.faults.brokers import env  # noqa: F401 - Redis and RabbitMQ
from tests.integration import app_tasks as t

pytestmark = pytest.mark.slow

W1, W2, W3 = "w1@itest", "w2@itest", "w3@itest"


def _pids(app: Celeriac, node: str) -> list[int]:
    got = app.control.inspect(destination=[node], timeout=5).stats()
    assert got is not None, f"{node} did not reply"
    pids: list[int] = got[node]["pool"]["processes"]
    return pids


def _cli(environ: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "celeriac", "-A",
                           "tests.integration.app_tasks", *args],
                          env={**os.environ, **environ}, capture_output=True, text=True,
                          timeout=60, cwd=str(Path(__file__).parent.parent.parent))


def test_three_workers(app: Celeriac, env: dict[str, str],  # noqa: F811
                       start_worker: Callable[..., WorkerProcess], tmp_path: Path) -> None:
    state = str(tmp_path / "w1.state")
    w1 = start_worker("-n", W1, "-c", "2", "--statedb", state, wait_ready=False)
    w2 = start_worker("-n", W2, "-c", "1", "-Q", "celery,q2", wait_ready=False)
    w3 = start_worker("-n", W3, "-c", "1", "-Q", "long3", wait_ready=False)
    for w in (w1, w2, w3):
        w.wait_for_log(r" ready: ", 30)
    ctl = app.control

    # Three replies; limit=3 returns as soon as they are in, long before the timeout.
    start = time.monotonic()
    assert merge(ctl.ping(timeout=10, limit=3)) == {n: {"ok": "pong"} for n in (W1, W2, W3)}
    assert time.monotonic() - start < 2
    inspect = ctl.inspect(timeout=10, limit=3)
    for method in ("active", "reserved", "scheduled", "revoked", "registered", "stats",
                   "active_queues", "conf", "report"):
        got = getattr(inspect, method)()
        assert got is not None and set(got) == {W1, W2, W3}, (method, got)

    # A worker stuck in a long task answers ping at once, and shows the task as active.
    marker = tmp_path / "long.pid"
    long = t.sleep.apply_async((60, str(marker)), queue="long3")
    wait_until(marker.exists, 15, message="the long task started")
    start = time.monotonic()
    assert ctl.ping(destination=[W3], timeout=5) == [{W3: {"ok": "pong"}}]
    assert time.monotonic() - start < 0.5
    active = ctl.inspect(destination=[W3]).active()
    assert active is not None and [a["id"] for a in active[W3]] == [long.id]
    assert active[W3][0]["worker_pid"] == int(marker.read_text())
    # Revoke with terminate: the child is killed, the task ends REVOKED, not redelivered.
    child = int(marker.read_text())
    marker.unlink()
    got = ctl.revoke(long.id, terminate=True, signal="SIGKILL", reply=True,
                     destination=[W3], timeout=5)
    assert got == [{W3: {"ok": f"terminate: {long.id}"}}]
    with pytest.raises(TaskRevoked, match="terminated"):
        long.get(timeout=10)
    assert long.state == states.REVOKED
    wait_until(lambda: child not in _pids(app, W3), 10, message="child replaced")
    deadline = time.monotonic() + 2.5  # past the lease (1 s) and the redelivery delay
    while time.monotonic() < deadline:
        assert not marker.exists(), "the revoked task ran again"
        time.sleep(0.05)  # sleep-ok: watching for a redelivery that must not come

    # Revoke before start: acknowledged unrun, REVOKED.
    ran = tmp_path / "ran"
    early = t.sleep.apply_async((0, str(ran)), countdown=1.5)
    assert len(ctl.revoke(early.id, reply=True, timeout=5, limit=3) or []) == 3
    with pytest.raises(TaskRevoked):
        early.get(timeout=10)
    assert not ran.exists()

    # pool_grow / pool_shrink take effect.
    assert len(_pids(app, W1)) == 2
    assert ctl.pool_grow(2, destination=[W1], reply=True) == [{W1: {"ok": "pool will grow"}}]
    wait_until(lambda: len(_pids(app, W1)) == 4, 10, message="grown to 4")
    assert ctl.pool_shrink(3, destination=[W1], reply=True) == [
        {W1: {"ok": "pool will shrink"}}]
    wait_until(lambda: len(_pids(app, W1)) == 1, 10, message="shrunk to 1")

    # rate_limit on w2 only: four stamps on its own queue spread over 0.75 s at 4/s (the
    # first may start late on a loaded machine, its grant was not: 0.69 s was seen), where
    # unlimited they would start together.
    assert ctl.rate_limit(t.stamp.name, "4/s", destination=[W2], reply=True) == [
        {W2: {"ok": "new rate limit set successfully"}}]
    stamps = sorted(r.get(timeout=15) for r in [t.stamp.apply_async(queue="q2")
                                                 for _ in range(4)])
    assert stamps[-1] - stamps[0] >= 0.5, stamps

    # The CLI, as Celery's: JSON for scripts, exit 1 when nobody replied.
    out = _cli(env, "inspect", "ping", "--json", "-t", "5")
    assert out.returncode == 0, out.stderr
    assert set(orjson.loads(out.stdout)) == {W1, W2, W3}
    out = _cli(env, "control", "rate_limit", t.stamp.name, "0", "-d", W2)
    assert out.returncode == 0 and "new rate limit set successfully" in out.stdout, out
    out = _cli(env, "inspect", "ping", "-d", "nobody@nowhere", "-t", "0.3")
    assert out.returncode == 1 and "No nodes replied" in out.stderr
    assert "3 nodes online" in _cli(env, "status").stdout

    # shutdown stops the named worker only.
    assert ctl.shutdown(destination=[W2], reply=True) == [{W2: {"ok": "shutting down"}}]
    assert w2.wait(15) == 0
    assert merge(ctl.ping(timeout=3, limit=2)) == {W1: {"ok": "pong"}, W3: {"ok": "pong"}}

    # A revoke survives w1's restart (statedb) and reaches a worker started after it
    # (the broker's store), and the task is not run when it comes.
    gone = str(uuid.uuid4())
    ctl.revoke(gone, reply=True, limit=2, timeout=5)
    assert w1.stop() == 0
    assert gone in orjson.loads(Path(state).read_bytes())["revoked"]
    w1 = start_worker("-n", W1, "-c", "1", "--statedb", state, "--without-mingle")
    w4 = start_worker("-n", "w4@itest", "-c", "1", "--without-mingle")
    for node in (W1, "w4@itest"):
        got = ctl.inspect(destination=[node], timeout=5).revoked()
        assert got is not None and gone in got[node], node
    late = t.add.apply_async((1, 1), task_id=gone)
    with pytest.raises(TaskRevoked):
        late.get(timeout=10)
    for w in (w1, w3, w4):
        assert "Traceback" not in w.log, w.log
