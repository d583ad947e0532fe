"""Fixtures for the transport and result-backend contract suites.

Every contract test takes ``transport`` or ``backend`` and so runs once per
implementation. A new broker or store joins the suites by adding one entry to
``TRANSPORT_URLS`` or ``BACKEND_URLS``: a function that returns a fresh, isolated URL for
one test (a unique name, a temporary file, a new Redis database or key prefix...).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from celeriac.backends.base import ResultBackend, backend_class, create_backend
from celeriac.settings import Settings
from celeriac.transports.base import Transport, create_transport, transport_class
from tests.loops import forget, track
from tests.services import require, sqs_url


def _namespaced(service: str) -> Callable[[Path], str]:
    """A URL on a shared server, isolated by a unique ``namespace`` (key/queue prefix)."""

    def url(tmp: Path) -> str:
        base = require(service)
        sep = "&" if "?" in base else "?"
        return f"{base}{sep}namespace=t{uuid.uuid4().hex[:12]}"

    return url


TRANSPORT_URLS: dict[str, Callable[[Path], str]] = {
    "memory": lambda tmp: f"memory://{uuid.uuid4().hex}",
    "sqlite": lambda tmp: f"sqlite:///{tmp / 'broker.db'}",
    "redis": _namespaced("redis"),
    "amqp": _namespaced("rabbitmq"),
    # Celery's layout has no namespace: kombu's global key prefix keeps tests apart.
    "redis-kombu": lambda tmp: f"{require('redis')}?layout=kombu&global_keyprefix="
                               f"t{uuid.uuid4().hex[:12]}:",
    # moto's server (tests/services.py); broadcasts go through Redis (SQS has no fanout).
    "sqs": lambda tmp: sqs_url(f"t{uuid.uuid4().hex[:12]}", fanout_url=require("redis")),
}


@dataclass(frozen=True)
class Layout:
    """Where a transport's layout differs from celeriac's own, by design (a layout shared
    with Celery's workers keeps their rules): the suite checks the rule that applies."""

    envelope: frozenset[str] = frozenset()
    """Properties the layout's envelope adds to every message (kombu's)."""
    redelivery_headers: frozenset[str] = frozenset()
    """Headers a counted redelivery adds (kombu's ``redelivered``, our loss count)."""
    priority_steps: tuple[int, ...] | None = None
    """Priorities rounded down to these steps, and the LOWEST step first (kombu on
    Redis); None: 0-9, the highest first."""
    delays_in_broker: bool = True
    """A producer's countdown waits in the broker; False: the message goes out at once
    with its ``eta`` header and the worker that takes it parks it (Celery's way)."""
    leases: bool = True
    """``worker_lease_timeout`` decides when a silent consumer's messages go back;
    False: kombu's visibility timeout does (``tests/compat/test_kombu_layout.py``)."""


LAYOUTS: dict[str, Layout] = {
    "redis-kombu": Layout(
        envelope=frozenset({"correlation_id", "reply_to", "delivery_mode", "delivery_info"}),
        redelivery_headers=frozenset({"redelivered", "x-celeriac-deliveries"}),
        priority_steps=(0, 3, 6, 9), delays_in_broker=False, leases=False),
}

BACKEND_URLS: dict[str, Callable[[Path], str]] = {
    "memory": lambda tmp: f"memory://{uuid.uuid4().hex}",
    "sqlite": lambda tmp: f"sqlite:///{tmp / 'results.db'}",
    "redis": _namespaced("redis"),
    "postgres": _namespaced("postgres"),
    # Celery's layout has no namespace: Celery's global key prefix keeps tests apart.
    "redis-celery": lambda tmp: f"{require('redis')}?layout=celery&global_keyprefix="
                                f"t{uuid.uuid4().hex[:12]}:",
}


def _celery_database(tmp: Path) -> str:
    """Celery's SQLAlchemy tables have fixed names: a database for each test process
    (by pid: pytest-xdist's processes, and two runs on one machine, stay apart), its
    tables dropped for each test (a process runs one test at a time), the database
    dropped as the process exits."""
    import atexit
    import os

    import psycopg

    server = require("postgres").rsplit("/", 1)[0]
    name = f"celeriac_contract_celery_{os.getpid()}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                             (name,)).fetchone():
            admin.execute(f'CREATE DATABASE "{name}"')
            atexit.register(_drop_database, f"{server}/postgres", name)
    with psycopg.connect(f"{server}/{name}", autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS celery_taskmeta, celery_tasksetmeta, "
                     "celeriac_chord_parts, celeriac_chords")
    return f"db+{server}/{name}"


BACKEND_URLS["postgres-celery"] = _celery_database


def _drop_database(admin_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _mysql_database(tmp: Path) -> str:
    """A MariaDB/MySQL database of the test's own (dropped after it: ``_drop_mysql``)."""
    import pymysql

    server = require("mysql").rsplit("/", 1)[0]
    name = f"celeriac_t{uuid.uuid4().hex[:12]}"
    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}`")
    finally:
        conn.close()
    return f"{server}/{name}"


def _drop_mysql(url: str) -> None:
    import pymysql

    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{url.rsplit('/', 1)[1].split('?')[0]}`")
    finally:
        conn.close()


def _mysql_emptied(kind: str) -> Callable[[Path], str]:
    """A MariaDB/MySQL database of this test process's own for each layout (by pid: the
    xdist processes and two runs stay apart; dropped as the process exits), its tables
    emptied for each test (a process runs one test at a time). MySQL's tests were a fifth
    of the fast tier's time on a loaded machine, and a database per test (a CREATE and a
    DROP DATABASE and the tables' DDL, each waiting on the disk) a third of theirs."""

    def url(tmp: Path) -> str:
        import atexit
        import os

        import pymysql

        server = require("mysql").rsplit("/", 1)[0]
        name = f"celeriac_contract_{kind}_{os.getpid()}"
        conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
        try:
            with conn.cursor() as cur:
                if not cur.execute("SHOW DATABASES LIKE %s", (name,)):
                    cur.execute(f"CREATE DATABASE `{name}`")
                    atexit.register(_drop_mysql, f"{server}/{name}")
                cur.execute("SELECT table_name FROM information_schema.tables WHERE "
                            "table_schema = %s AND table_type = 'BASE TABLE'", (name,))
                # The write counter's row stays: a backend that finds its tables does
                # not insert it again. Chord parts first: they reference the chords.
                tables = sorted((t for (t,) in cur.fetchall() if not t.endswith("_seq")),
                                key=lambda t: not t.endswith("chord_parts"))
                conn.begin()  # one commit, one wait on the disk
                for table in tables:
                    cur.execute(f"DELETE FROM `{name}`.`{table}`")
                conn.commit()
        finally:
            conn.close()
        return f"{server}/{name}"

    return url


BACKEND_URLS["mysql"] = _mysql_emptied("mysql")
# Celery's SQLAlchemy tables have fixed names: a database of their own keeps them apart
# from celeriac's layout (both have a celeriac_chords table, not the same).
BACKEND_URLS["mysql-celery"] = lambda tmp: f"db+{_mysql_emptied('mysqlc')(tmp)}"


def _django_db(alias: str) -> Callable[[Path], str]:
    """django-celery-results' tables (made from its models) in a database of this test
    process's own, emptied for each test: ``tests/django/env.py``."""

    def url(tmp: Path) -> str:
        from tests.django import env

        if alias == env.PG_ALIAS:
            require("postgres")
        env.configure()
        if alias == env.PG_ALIAS:
            env.create_pg_database()
        env.create_tables(alias, ("django_celery_results",))
        env.empty(alias)
        return f"django-db://{alias}"

    return url


BACKEND_URLS["django-sqlite"] = _django_db("default")
BACKEND_URLS["django-postgres"] = _django_db("pg")


class TransportFactory:
    """Makes transports that all talk to one broker (one URL), and closes them after."""

    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.url = url
        self._made: list[Transport] = []

    @property
    def process_local(self) -> bool:
        """True when the broker cannot be shared with other processes."""
        return transport_class(self.url).process_local

    @property
    def layout(self) -> Layout:
        return LAYOUTS.get(self.name, Layout())

    def settings(self, **changes: Any) -> Settings:
        return Settings(broker_url=self.url, **changes)

    def __call__(self, **settings: Any) -> Transport:
        """A new transport instance (a new connection) on this test's broker."""
        t = create_transport(self.url, self.settings(**settings))
        self._made.append(track(t))
        return t

    def close_all(self) -> None:
        forget()
        for t in self._made:
            t.close()


class BackendFactory:
    """Makes result backends that all use one store (one URL), and closes them after."""

    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.url = url
        self._made: list[ResultBackend] = []

    @property
    def process_local(self) -> bool:
        return backend_class(self.url).process_local

    def settings(self, **changes: Any) -> Settings:
        return Settings(result_backend=self.url, **changes)

    def __call__(self, **settings: Any) -> ResultBackend:
        b = create_backend(self.url, self.settings(**settings))
        self._made.append(b)
        return b

    def close_all(self) -> None:
        for b in self._made:
            b.close()


SLOW_TRANSPORTS = {"sqs"}
"""Run in ``make test``, not the fast tier: moto's server takes tens of milliseconds a
call, half a second a test."""


@pytest.fixture(params=[pytest.param(name, marks=pytest.mark.slow) if name in SLOW_TRANSPORTS
                        else name for name in sorted(TRANSPORT_URLS)])
def transport(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TransportFactory]:
    factory = TransportFactory(request.param, TRANSPORT_URLS[request.param](tmp_path))
    yield factory
    factory.close_all()
    if request.param == "redis":
        _drop_redis_namespace(factory.url)
    elif request.param == "amqp":
        # A few hundred delete round trips (a queue's 31 delay levels): done beside the
        # next tests rather than in front of them; each test has its own namespace.
        _CLEANUPS.append(_cleaner().submit(_drop_amqp_namespace, factory.url))


_CLEANER: list[ThreadPoolExecutor] = []
_CLEANUPS: list[Future[None]] = []


def _cleaner() -> ThreadPoolExecutor:
    if not _CLEANER:
        _CLEANER.append(ThreadPoolExecutor(1, thread_name_prefix="amqp-cleanup"))
    return _CLEANER[0]


@pytest.fixture(scope="session", autouse=True)
def _amqp_cleanups_finish() -> Iterator[None]:
    """Every namespace handed to the cleanup thread is gone before the session ends; a
    cleanup that failed fails the run here."""
    yield
    for pool in _CLEANER:
        pool.shutdown(wait=True)
    for done in _CLEANUPS:
        done.result()


_AMQP_NAMES = ("contract", "a", "b", "other", "keep", "warm-up", "celeriac.dead", "events",
               "celeriac.events")


def _drop_amqp_namespace(url: str, names: tuple[str, ...] = _AMQP_NAMES,
                         delayed: tuple[str, ...] = ("contract", "a", "b", "other", "keep")
                         ) -> None:
    """Delete the durable queues and exchanges a test declared (idempotent): ``names``,
    and the delay levels of the queues in ``delayed``."""
    import pika

    from celeriac.transports.amqp import wire as amqp_wire

    ns = _namespace(url)
    conn = pika.BlockingConnection(pika.URLParameters(url.partition("?")[0].rstrip("/") + "/%2F"))
    try:
        ch = conn.channel()
        for name in names:
            ch.queue_delete(f"{ns}{name}")
            ch.exchange_delete(f"{ns}{name}")
            if name in delayed:
                for k in range(amqp_wire.DELAY_LEVELS):
                    ch.queue_delete(f"{ns}celeriac.delay.{name}.{k}")
                    ch.exchange_delete(f"{ns}celeriac.delay.{name}.{k}")
    finally:
        conn.close()


# Behaviours an AMQP broker does not offer; the reason is shown in the test report.
NOT_ON_AMQP = {
    "test_priority_applies_across_queues":
        "AMQP orders by priority within one queue only (Celery on RabbitMQ alike)",
    "test_expired_lease_returns_messages_through_another_heartbeat":
        "on AMQP the lease is the connection: the broker returns a consumer's messages when "
        "its connection drops (tests/faults kill -9), never while it is open",
    "test_disconnect_returns_owned_messages_uncounted":
        "AMQP cannot put a message back in place: given-back messages go to the back of "
        "their priority (counts are kept, as the amqp-specific tests check)",
    "test_fetch_from_several_queues_takes_only_those":
        "checks queue_length after the consumer's event loop ended, which closes the AMQP "
        "connection and so returns its unacked messages",
    "test_fetch_respects_limit":
        "checks queue_length after the consumer's event loop ended (the connection closed)",
    "test_ack_removes_for_good":
        "checks queue_length after the consumer's event loop ended (the connection closed)",
}


# And what SQS does not offer (tests/contracts/test_sqs_specific.py checks SQS's own way).
NOT_ON_SQS = {
    **dict.fromkeys(("test_higher_priority_first", "test_priority_applies_across_queues"),
                    "SQS has no priorities (Celery on SQS alike)"),
    **dict.fromkeys(("test_delayed_message_is_held_until_due",
                     "test_idle_fetch_returns_a_delayed_message_published_while_it_waits",
                     "test_requeue_with_a_delay_holds_it_in_the_delay_store"),
                    "SQS delays are whole seconds (DelaySeconds): sub-second ones round up"),
    "test_expired_lease_returns_messages_through_another_heartbeat":
        "SQS returns a silent consumer's messages itself when their visibility lapses",
    "test_disconnect_returns_owned_messages_uncounted":
        "SQS cannot put a message back in place uncounted: a copy goes to the back",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        name = item.name.split("[")[0]
        if name in NOT_ON_AMQP and item.name.endswith("[amqp]"):
            item.add_marker(pytest.mark.skip(reason=f"not on AMQP: {NOT_ON_AMQP[name]}"))
        if name in NOT_ON_SQS and item.name.endswith("[sqs]"):
            item.add_marker(pytest.mark.skip(reason=f"not on SQS: {NOT_ON_SQS[name]}"))


def _namespace(url: str) -> str:
    query = url.partition("?")[2]
    return dict(p.split("=", 1) for p in query.split("&") if "=" in p)["namespace"]


def _drop_redis_namespace(url: str) -> None:
    """Each contract test used its own key prefix: leave none of its keys behind."""
    import redis

    client = redis.Redis.from_url(url.partition("?")[0])
    try:
        keys = list(client.scan_iter(match=f"{_namespace(url)}:*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start:start + 500])
    finally:
        client.close()


@pytest.fixture(params=sorted(BACKEND_URLS))
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BackendFactory]:
    factory = BackendFactory(request.param, BACKEND_URLS[request.param](tmp_path))
    yield factory
    factory.close_all()
    if request.param == "postgres":
        _drop_postgres_table(factory.url)
    elif request.param == "redis":
        _drop_redis_namespace(factory.url)


def _drop_postgres_table(url: str) -> None:
    """Each contract test made its own ``<namespace>_results`` table: leave none behind."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(url.partition("?")[0], autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(
            sql.Identifier(f"{_namespace(url)}_results")))
