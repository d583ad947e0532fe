"""The transactional outbox on PostgreSQL (``app.transaction(conn)``): what a commit and
a rollback leave in the outbox table and the broker, each kind of connection (psycopg,
SQLAlchemy, Django in a subprocess of its own), the scope's isolation between threads and
asyncio tasks, and three ``celeriac outbox relay`` processes draining one table at once.

A database of this module's own on the shared PostgreSQL, a Redis namespace per test as
the broker; the relays of the last test are real processes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from celeriac import Celeriac
from celeriac.canvas import followups
from celeriac.errors import ConfigurationError
from celeriac.producer import outbox as _outbox
from celeriac.producer import outbox_relay
from celeriac.producer.outbox_relay import Relay
from celeriac.protocol import Message
from celeriac.testing import wait_until
from celeriac.transports.base import Outgoing
from tests.contracts.conftest import _drop_redis_namespace
from tests.loops import run, track
from tests.services import require

ROOT = Path(__file__).parent.parent.parent


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    server = require("postgres").rsplit("/", 1)[0]
    name = f"celeriac_outbox_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield f"{server}/{name}"
    _outbox.forget_tables()
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def app(database: str) -> Iterator[Celeriac]:
    """An app on a Redis namespace of its own, with an outbox table of its own."""
    broker = f"{require('redis')}?namespace=ob{uuid.uuid4().hex[:10]}"
    table = f"outbox_{uuid.uuid4().hex[:8]}"
    app = Celeriac("outbox_itest", broker=broker, outbox_url=database, outbox_table=table,
                   set_as_current=False)

    @app.task(name="outbox.add")
    def add(x: int, y: int) -> int:
        return x + y

    yield app
    app.close()
    _drop_redis_namespace(broker)


def rows(url: str, table: str) -> list[str]:
    with psycopg.connect(url) as conn:
        exists = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
        if not exists or exists[0] is None:
            return []
        return [r[0] for r in conn.execute(f'SELECT task_id FROM "{table}" ORDER BY id')]


def broker_ids(app: Celeriac, expected: int) -> list[str]:
    """The ids of the messages in the app's default queue (fetched, never acked)."""
    transport = track(app.transport)

    async def drain() -> list[str]:
        await transport.connect(f"check-{uuid.uuid4().hex[:6]}")
        ids: list[str] = []
        for _ in range(50):
            got = await transport.fetch(["celery"], 500, 0.2)
            ids.extend(d.message.headers["id"] for d in got)
            if not got and len(ids) >= expected:
                break
        return ids

    return run(drain())


def test_commit_writes_rows_that_the_relay_publishes_once(app: Celeriac, database: str
                                                          ) -> None:
    add = app.tasks["outbox.add"]
    with psycopg.connect(database) as conn:
        with app.transaction(conn):
            results = [add.delay(i, i) for i in range(5)]
            later = add.apply_async((1, 2), countdown=60)
            named = app.send_task("outbox.add", (3, 4))
            # The ids are fixed at delay(); nothing is visible outside yet.
            assert rows(database, app.settings.outbox_table) == []
        ids = [r.id for r in (*results, later, named)]
        assert rows(database, app.settings.outbox_table) == ids
    relay = Relay(app)
    try:
        assert relay.drain_once() == 7
        assert relay.drain_once() == 0
    finally:
        relay.close()
    assert rows(database, app.settings.outbox_table) == []
    assert sorted(broker_ids(app, 6)) == sorted([*ids[:5], named.id])  # `later` waits
    assert app.transport.queue_length("celery") == 0


def test_a_row_that_cannot_be_decoded_stays_and_the_rest_go(
        app: Celeriac, database: str, caplog: pytest.LogCaptureFixture) -> None:
    add = app.tasks["outbox.add"]
    table = app.settings.outbox_table
    with psycopg.connect(database) as conn:
        with app.transaction(conn):
            first = add.delay(1, 1)
        conn.execute(f'INSERT INTO "{table}" (task_id, queue, envelope, body, created) '
                     "VALUES ('broken', 'celery', 'not json', '', 0)")
        conn.commit()
        with app.transaction(conn):
            last = add.delay(2, 2)
    relay = Relay(app)
    try:
        assert relay.drain_once() == 3
        assert relay.published == 2
        assert relay.drain_once() == 0  # skipped from now on
    finally:
        relay.close()
    assert rows(database, table) == ["broken"]
    assert "task broken (row" in caplog.text and "left in the table" in caplog.text
    assert sorted(broker_ids(app, 2)) == sorted([first.id, last.id])


def test_a_rollback_sends_nothing(app: Celeriac, database: str) -> None:
    add = app.tasks["outbox.add"]
    with psycopg.connect(database) as conn:
        with pytest.raises(RuntimeError), app.transaction(conn):
            add.delay(1, 1)
            raise RuntimeError("the request failed")
        # The scope ended with the block: this one goes to the broker directly.
        direct = add.delay(2, 2)
        with conn.transaction() as outer:  # an outer transaction the caller rolls back
            with app.transaction(conn):
                add.delay(3, 3)
            raise psycopg.Rollback(outer)  # rolls it back; psycopg swallows it
    assert rows(database, app.settings.outbox_table) == []
    relay = Relay(app)
    try:
        assert relay.drain_once() == 0
    finally:
        relay.close()
    assert broker_ids(app, 1) == [direct.id]


def test_sqlalchemy_session_and_connection(app: Celeriac, database: str) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.orm import Session

    engine = sqlalchemy.create_engine(database.replace("postgresql://",
                                                       "postgresql+psycopg://"))
    add = app.tasks["outbox.add"]
    try:
        with Session(engine) as session:
            with app.transaction(session):
                kept = add.delay(1, 2)
            with pytest.raises(KeyError), app.transaction(session):
                add.delay(9, 9)
                raise KeyError("rolled back")
            session.execute(sqlalchemy.text("SELECT 1"))  # a transaction in progress:
            with app.transaction(session):                # the block is a savepoint
                inner = add.delay(2, 3)
            session.commit()
        with engine.connect() as connection, app.transaction(connection):
            third = add.delay(3, 4)
    finally:
        engine.dispose()
    assert rows(database, app.settings.outbox_table) == [kept.id, inner.id, third.id]
    with pytest.raises(ConfigurationError, match="PostgreSQL"):
        app.transaction(Session(sqlalchemy.create_engine("sqlite://"))).__enter__()


def test_the_scope_is_the_block_s_thread_and_task_only(app: Celeriac, database: str
                                                       ) -> None:
    add = app.tasks["outbox.add"]
    other = Celeriac("other", broker="memory://", set_as_current=False)
    seen: dict[str, bool] = {}

    def in_thread() -> None:
        seen["thread"] = _outbox.active(app)

    async def child() -> None:
        seen["task"] = _outbox.active(app)

    async def main() -> None:
        with psycopg.connect(database) as conn, app.transaction(conn):
            seen["owner"] = _outbox.active(app)
            seen["other app"] = _outbox.active(other)
            await asyncio.create_task(child())
            add.delay(1, 1)

    with psycopg.connect(database) as conn, app.transaction(conn):
        t = threading.Thread(target=in_thread)
        t.start()
        t.join()
    asyncio.run(main())
    assert seen == {"thread": False, "owner": True, "other app": False, "task": False}
    assert len(rows(database, app.settings.outbox_table)) == 1
    other.close()


def test_bad_arguments_are_refused_by_name(app: Celeriac) -> None:
    with pytest.raises(TypeError, match="psycopg 3 Connection"):
        app.transaction(object()).__enter__()
    with pytest.raises(ConfigurationError, match="outbox_url"):
        Relay(Celeriac("x", broker="memory://", set_as_current=False))
    with pytest.raises(ConfigurationError, match="outbox_table"):
        _outbox.quoted("bad name; DROP TABLE x")
    assert outbox_relay.CLAIM_HEADER == followups.CLAIM_HEADER


def test_a_row_keeps_what_the_broker_needs() -> None:
    message = Message({"id": "t1", "task": "outbox.add"}, b"[[], {}, {}]")
    for item in (Outgoing("celery", message, 30.0), Outgoing("group", message, 30.0, True)):
        task_id, queue, envelope, body, eta, _, fanout = _outbox.row(item, 1000.0)
        back = _outbox.outgoing(queue, envelope, body, eta, 1010.0, fanout)
        assert (task_id, back.queue, back.message, back.fanout) == \
            ("t1", item.queue, message, item.fanout)
        # The remaining delay; a fanout group's copies go at once (the eta is a header).
        assert back.delay == (None if item.fanout else 20.0)


def test_outbox_status_command(database: str) -> None:
    from click.testing import CliRunner

    from celeriac.cli import main

    status = ["outbox", "status", "--url", database]  # no -A: the default outbox_table
    out = CliRunner().invoke(main, status)
    assert out.exit_code == 0 and "celeriac_outbox: no table yet" in out.output, out.output
    app = Celeriac("status", broker="memory://", set_as_current=False)
    with psycopg.connect(database) as conn, app.transaction(conn):
        app.send_task("outbox.add", (1, 2))
    out = CliRunner().invoke(main, status)
    assert "celeriac_outbox: 1 message(s) waiting, oldest" in out.output, out.output
    app.close()


DJANGO_SCRIPT = """
import sys, django
from django.conf import settings
url, table, broker = sys.argv[1:4]
db = url.rsplit("/", 1)[1]
settings.configure(DATABASES={"default": {"ENGINE": "django.db.backends.postgresql",
    "NAME": db, "USER": "postgres", "HOST": "127.0.0.1", "PORT": "5432"}})
django.setup()
from django.db import connection, transaction
from celeriac import Celeriac
app = Celeriac("dj", broker=broker, outbox_table=table)
@app.task(name="outbox.add")
def add(x, y):
    return x + y
with app.transaction(connection):
    print(add.delay(1, 2).id)
try:
    with transaction.atomic(), app.transaction(using="default"):
        add.delay(9, 9)
        raise KeyError("x")
except KeyError:
    pass
with transaction.atomic():
    with app.transaction(using="default"):
        print(add.delay(2, 3).id)
"""


@pytest.mark.slow  # Django started in a process of its own: 5-8 s on a loaded machine
def test_django_atomic_blocks(app: Celeriac, database: str) -> None:
    pytest.importorskip("django")
    out = subprocess.run(
        [sys.executable, "-c", DJANGO_SCRIPT, database, app.settings.outbox_table,
         app.settings.broker_url], capture_output=True, text=True, timeout=60,
        cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert rows(database, app.settings.outbox_table) == out.stdout.split()


@pytest.mark.slow
def test_three_relay_processes_publish_each_message_once(app: Celeriac, database: str,
                                                         tmp_path: Path) -> None:
    add = app.tasks["outbox.add"]
    with psycopg.connect(database) as conn, app.transaction(conn):
        ids = [add.delay(0, i).id for i in range(100)]  # waiting before the relays start
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CELERIAC_BROKER_URL":
           app.settings.broker_url, "CELERIAC_OUTBOX_URL": database,
           "CELERIAC_OUTBOX_TABLE": app.settings.outbox_table}
    relays = [Relayer(env, tmp_path) for _ in range(3)]
    try:
        wait_until(lambda: all("relay ready" in r.log for r in relays), 60,
                   message="three relays ready")
        # Committed while all three wait: each NOTIFY wakes them all, and they split the
        # rows between them (SKIP LOCKED).
        with psycopg.connect(database) as conn:
            for chunk in range(1, 26):
                with app.transaction(conn):
                    ids.extend(add.delay(chunk, i).id for i in range(20))
        wait_until(lambda: not rows(database, app.settings.outbox_table), 30,
                   message="the relays drained the outbox")
    finally:
        published = [r.stop() for r in relays]
    assert sum(published) == len(ids) == 600, [r.log for r in relays]
    assert sum(n > 0 for n in published) >= 2, published
    got = broker_ids(app, len(ids))
    assert len(got) == len(set(got)) == 600
    assert set(got) == set(ids)


class Relayer:
    """``celeriac outbox relay`` in a process of its own; ``stop()`` says how many it
    published (SIGTERM, then its last line)."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celeriac", "-A", "tests.faults.test_outbox_app",
             "outbox", "relay", "--batch", "20"], env=env, cwd=str(cwd),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        with self.proc.stderr:
            self.lines.extend(self.proc.stderr)

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(5)
        self.reader.join(5)
        assert self.proc.returncode == 0, self.log
        return int(self.log.rsplit("stopped: ", 1)[1].split()[0])
