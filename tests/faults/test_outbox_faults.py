"""The outbox under faults, with real processes: a producer ``kill -9``ed right after its
commit, a relay ``kill -9``ed between the broker's confirmation and its delete, and the
broker down for 30 s. Every run of a task writes a ledger row (``test_outbox_app.record``),
so "0 lost, 0 sent twice" is counted per task id.

One worker for the module (``worker_outbox=true``: its relay drains the outbox) on a Redis
of the module's own (AOF, ``appendfsync always``; stopped and started by the outage
test), results and claims in a namespace of the shared Redis, the outbox and the ledger in
a PostgreSQL database of the module's own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from celeriac.producer import outbox as _outbox
from celeriac.testing import WorkerProcess, wait_until
from tests.contracts.conftest import _drop_redis_namespace
from tests.faults.redis_sets import executable, free_ports
from tests.services import reachable, require

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parent.parent.parent
TABLE = "outbox_faults"


@dataclass
class Setup:
    database: str
    env: dict[str, str]
    worker: WorkerProcess
    redis_argv: list[str]
    port: int
    redis: subprocess.Popen[bytes]

    def start_redis(self) -> None:
        self.redis = subprocess.Popen(self.redis_argv, stdout=subprocess.DEVNULL)
        wait_until(lambda: reachable("127.0.0.1", self.port), 10, message="redis up")

    def stop_redis(self) -> None:
        self.redis.send_signal(signal.SIGTERM)  # a clean stop; the AOF holds every write
        self.redis.wait(10)

    def ledger(self) -> Counter[str]:
        with psycopg.connect(self.database) as conn:
            return Counter(r[0] for r in conn.execute("SELECT task_id FROM ledger"))

    def waiting(self) -> int:
        with psycopg.connect(self.database) as conn:
            found = conn.execute(f"SELECT count(*) FROM {TABLE}").fetchone()
            return int(found[0]) if found else 0

    def all_ran(self, ids: list[str], timeout: float) -> Counter[str]:
        """The ledger once every id in it ran; fails after ``timeout`` s."""
        wait_until(lambda: set(ids) <= set(self.ledger()), timeout,
                   message=f"{len(ids)} tasks ran")
        return self.ledger()

    def produce(self, script: str, *args: str) -> tuple[int, list[str]]:
        """Run a producer script; its exit status and the task ids it printed."""
        out = subprocess.run([sys.executable, "-c", script, *args], env=self.env,
                             cwd=str(ROOT), capture_output=True, text=True, timeout=60)
        return out.returncode, out.stdout.split()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    server = require("postgres").rsplit("/", 1)[0]
    name = f"celeriac_outbox_f_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    database = f"{server}/{name}"
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("CREATE TABLE ledger (task_id text NOT NULL, pid int NOT NULL)")
    port = free_ports(1)[0]
    tmp = tmp_path_factory.mktemp("outbox-redis")
    argv = [executable("redis-server"), "--port", str(port), "--bind", "127.0.0.1",
            "--dir", str(tmp), "--appendonly", "yes", "--appendfsync", "always", "--save", ""]
    results = f"{require('redis')}?namespace=obf{uuid.uuid4().hex[:10]}"
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "CELERIAC_BROKER_URL": f"redis://127.0.0.1:{port}/0",
           "CELERIAC_RESULT_BACKEND": results, "CELERIAC_OUTBOX_URL": database,
           "CELERIAC_OUTBOX_TABLE": TABLE, "CELERIAC_WORKER_OUTBOX": "true",
           "OUTBOX_LEDGER_URL": database}
    worker = WorkerProcess("tests.faults.test_outbox_app", "-c", "2", env=env,
                           cwd=str(tmp))
    s = Setup(database, env, worker, argv, port, None)  # type: ignore[arg-type]
    s.start_redis()
    try:
        worker.start(ready_timeout=60)
        yield s
    finally:
        worker.kill()
        if s.redis.poll() is None:
            s.redis.kill()
            s.redis.wait(5)
        _drop_redis_namespace(results)
        _outbox.forget_tables()
        with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


PRODUCER = """
import os, signal, sys, psycopg
from tests.faults.test_outbox_app import app, record
ids = []
with psycopg.connect(os.environ["CELERIAC_OUTBOX_URL"]) as conn:
    for n in range(int(sys.argv[1])):
        with app.transaction(conn):
            ids.extend(record.delay(n * 100 + i).id for i in range(int(sys.argv[2])))
    print(" ".join(ids), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # right after the last commit: no goodbye
"""


def test_a_producer_killed_right_after_its_commit_loses_nothing(setup: Setup) -> None:
    status, ids = setup.produce(PRODUCER, "10", "30")
    assert status == -signal.SIGKILL
    assert len(ids) == 300
    ran = setup.all_ran(ids, 60)
    assert [i for i in ids if ran[i] != 1] == []  # 0 lost, 0 run twice
    wait_until(lambda: setup.waiting() == 0, 10, message="the outbox emptied")


RELAY_KILLED = """
import os, signal, sys, psycopg
from tests.faults.test_outbox_app import app, record
from celeriac.producer.outbox_relay import Relay
if sys.argv[1] == "die":
    with psycopg.connect(os.environ["CELERIAC_OUTBOX_URL"]) as conn, app.transaction(conn):
        print(" ".join(record.delay(i).id for i in range(50)), flush=True)
    publish = app.transport.publish_many
    def publish_then_die(items):
        publish(items)  # the broker confirmed every message...
        os.kill(os.getpid(), signal.SIGKILL)  # ...and the relay dies before its delete
    app.transport.publish_many = publish_then_die
print(Relay(app, batch=50).drain_once())
"""


def test_a_relay_killed_between_publish_and_delete_runs_each_task_once(setup: Setup
                                                                       ) -> None:
    # A table the worker's relay does not drain, so that the relay killed here publishes
    # the rows first; the next relay publishes them again (the one case of a duplicate
    # in the broker), each with a claim of its own, and the worker runs each task once.
    env = setup.env
    setup.env = {**env, "CELERIAC_OUTBOX_TABLE": f"{TABLE}_killed"}
    try:
        status, ids = setup.produce(RELAY_KILLED, "die")
        assert status == -signal.SIGKILL and len(ids) == 50
        assert setup.produce(RELAY_KILLED, "again") == (0, ["50"])  # all 50 again
    finally:
        setup.env = env
    ran = setup.all_ran(ids, 60)
    assert [i for i in ids if ran[i] != 1] == []
    wait_until(lambda: setup.worker.log.count("another copy of this chord body ran") >= 50,
               20, message="the 50 second copies acknowledged unrun")


@pytest.mark.timeout(110)
def test_broker_down_30s_loses_nothing_and_sends_nothing_twice(setup: Setup) -> None:
    status, before = setup.produce(PRODUCER.replace("os.kill", "# os.kill"), "2", "50")
    assert status == 0
    setup.all_ran(before, 60)
    setup.stop_redis()
    try:
        status, during = setup.produce(PRODUCER.replace("os.kill", "# os.kill"), "4", "50")
        assert status == 0 and len(during) == 200
        # The relay keeps trying with backoff while the rows wait, committed.
        setup.worker.wait_for_log(r"outbox relay: broker failed", 30)
        outage_ends = time.monotonic() + 30
        wait_until(lambda: time.monotonic() >= outage_ends and setup.waiting() == 200, 40,
                   message="30 s of outage with the 200 rows waiting")
    finally:
        setup.start_redis()
    ran = setup.all_ran(before + during, 60)
    assert [i for i in before + during if ran[i] != 1] == []  # 0 lost, 0 run twice
    assert setup.waiting() == 0
    setup.worker.wait_for_log(r"outbox relay: publishing works again", 10)
