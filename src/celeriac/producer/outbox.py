"""The transactional outbox: ``with app.transaction(conn):`` makes every message sent
inside the block a row of the outbox table, written in the block's database transaction
(PostgreSQL), so it exists exactly when the transaction committed. A relay
(``outbox_relay.py``) publishes the rows to the broker and deletes them.

The block is a transaction of its own, or a savepoint inside one the caller holds: a
psycopg 3 ``Connection`` (``conn.transaction()``), Django (``transaction.atomic(using)``:
pass ``django.db.connection``, a connection of ``django.db.connections``, or
``using="alias"``), an SQLAlchemy ``Session`` or ``Connection`` (``begin()``, or
``begin_nested()`` when one is already in progress). Django and SQLAlchemy are imported
only when their objects are given.

Messages are fully built at ``delay()`` (the task id, hence the ``AsyncResult``, is
fixed there) and kept in the block's ``Scope``; as the block ends without an exception
they are inserted in one statement with a ``pg_notify`` on the table's name (which
PostgreSQL delivers at commit, waking the relays), then the transaction commits. An
exception discards them with the transaction.

The scope is a context variable, and it applies only to the thread or asyncio task that
opened it: an asyncio task created inside the block inherits the variable but publishes
directly, as it would outside (it may outlive the block).

Schema, created on first use in the connection's database (``outbox_table``, optionally
``schema.table``)::

    <table>(id bigserial PRIMARY KEY, task_id text, queue text, envelope bytea,
            body bytea, eta double precision (unix time; NULL: now),
            created double precision (unix time), fanout boolean (queue names a
            fanout group: ``Outgoing.fanout``))
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError
from ..protocol import Message
from ..transports.base import Outgoing, Publisher
from . import outbox_adapters

if TYPE_CHECKING:
    from ..app import Celeriac

_TABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,50}(\.[A-Za-z_][A-Za-z0-9_]{0,50})?")
_CURRENT: contextvars.ContextVar[Scope | None] = contextvars.ContextVar(
    "celeriac_outbox", default=None)
_KNOWN: set[tuple[str, str]] = set()
"""(database, table) pairs this process found to exist: not looked up again."""
_KNOWN_LOCK = threading.Lock()


def quoted(table: str) -> str:
    """``outbox_table`` as SQL (each part double-quoted); a clear error if malformed."""
    if not isinstance(table, str) or not _TABLE.fullmatch(table):
        raise ConfigurationError(
            f"outbox_table must be a table name or schema.table (letters, digits, _; "
            f"at most 51 characters each), got {table!r}")
    return ".".join(f'"{part}"' for part in table.split("."))


def ddl(table: str) -> str:
    q = quoted(table)
    return (f"CREATE TABLE IF NOT EXISTS {q} (id bigserial PRIMARY KEY, "
            "task_id text NOT NULL, queue text NOT NULL, envelope bytea NOT NULL, "
            "body bytea NOT NULL, eta double precision, created double precision NOT NULL, "
            "fanout boolean NOT NULL DEFAULT false)")


def lock_key(table: str) -> int:
    """The advisory lock that serializes the table's creation (a signed 64-bit int)."""
    import hashlib  # deferred: only the outbox's table creation needs it

    digest = hashlib.blake2b(f"celeriac-outbox:{table}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@dataclass
class Scope:
    """One ``app.transaction()`` block: the messages its owner sent, not yet written."""

    app: Celeriac
    adapter: outbox_adapters.Adapter
    owner: tuple[int, int]
    pending: list[Outgoing] = field(default_factory=list)
    writer: OutboxWriter | None = None


class OutboxWriter(Publisher):
    """The publisher a scope's owner sends to: it keeps the messages for the block's end."""

    def __init__(self, scope: Scope) -> None:
        super().__init__("outbox://", scope.app.settings)
        self.scope = scope

    def publish_many(self, items: Sequence[Outgoing]) -> None:
        for item in items:
            self.check_size(item.message)
        self.scope.pending.extend(items)


def _owner() -> tuple[int, int]:
    """This thread and asyncio task (0 outside a loop)."""
    task = None
    # Not imported here (~20 ms for a producer): no loop runs unless asyncio was imported.
    asyncio = sys.modules.get("asyncio")
    if asyncio is not None and asyncio._get_running_loop() is not None:
        task = asyncio.current_task()
    return threading.get_ident(), id(task) if task is not None else 0


def publisher(app: Celeriac) -> Publisher:
    """Where a send goes now: the open block's outbox (this app's, opened by this thread
    or task), else the broker."""
    scope = _CURRENT.get()
    if scope is None or scope.app is not app or scope.writer is None \
            or scope.owner != _owner():
        return app.publisher
    return scope.writer


def active(app: Celeriac) -> bool:
    """Whether this app's sends go to an outbox here."""
    return publisher(app) is not app.publisher


@contextlib.contextmanager
def transaction(app: Celeriac, conn: Any = None, *, using: str | None = None
                ) -> Iterator[Any]:
    """``app.transaction(conn)``: the block is a database transaction (a savepoint in
    one already open) and every message sent in it is written to the outbox table in
    it; an exception rolls both back. Yields what ``conn``'s own block yields
    (psycopg's ``Transaction``, SQLAlchemy's transaction, Django's None)."""
    adapter = outbox_adapters.adapter_for(conn, using)
    table = app.settings.outbox_table
    quoted(table)
    scope = Scope(app, adapter, _owner())
    scope.writer = OutboxWriter(scope)
    with adapter.block() as inner:
        token = _CURRENT.set(scope)
        try:
            yield inner
        finally:
            _CURRENT.reset(token)
            scope.writer = None  # a send after the block must not land in a dead list
        # Only reached without an exception: the rows join the transaction before it
        # commits (as the ``with`` above exits), or vanish with it.
        if scope.pending:
            write(adapter, table, scope.pending)


def ensure_table(adapter: outbox_adapters.Adapter, table: str, *, cache: bool = True
                 ) -> None:
    """Create the table if it is missing. Two first writers would race in ``CREATE
    TABLE IF NOT EXISTS`` (one fails on the catalog's unique index, aborting its
    caller's transaction): the advisory lock, held to the end of the transaction, makes
    the second wait and then find the table. A table found is remembered (per process
    and database); one created here is not, since the caller's transaction may yet roll
    its creation back."""
    key = (adapter.database(), table)
    if cache and key in _KNOWN:
        return
    if adapter.fetch_one("SELECT to_regclass(%s) IS NOT NULL", (quoted(table),)) is True:
        with _KNOWN_LOCK:
            _KNOWN.add(key)
        return
    adapter.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(table),))
    adapter.execute(ddl(table))


def forget_tables() -> None:
    """Forget which tables exist (after a test drops its database, say)."""
    with _KNOWN_LOCK:
        _KNOWN.clear()


def write(adapter: outbox_adapters.Adapter, table: str, items: Sequence[Outgoing]) -> None:
    """Insert the messages and notify the relays (delivered at commit): one statement,
    one round trip, however many messages (a column per array)."""
    ensure_table(adapter, table)
    now = time.time()
    columns = list(zip(*(row(item, now) for item in items), strict=True))
    adapter.execute(
        f"WITH written AS (INSERT INTO {quoted(table)} "
        "(task_id, queue, envelope, body, eta, created, fanout) SELECT * FROM unnest("
        "%s::text[], %s::text[], %s::bytea[], %s::bytea[], %s::float8[], %s::float8[], "
        "%s::bool[]) RETURNING 1) SELECT pg_notify(%s, '')",
        [*(list(c) for c in columns), table])


def row(item: Outgoing, now: float) -> tuple[Any, ...]:
    message = item.message
    eta = now + item.delay if item.delay is not None and item.delay > 0 else None
    return (message.headers["id"], item.queue, message.envelope(), message.body, eta, now,
            item.fanout)


def outgoing(queue: str, envelope: bytes, body: bytes, eta: float | None,
             now: float, fanout: bool = False) -> Outgoing:
    """A row back as what the broker takes; a due ``eta`` is sent at once (a fanout
    group's copies always are: the eta stays in their headers)."""
    message = Message.from_envelope(bytes(envelope), bytes(body))
    delay = eta - now if eta is not None and eta > now and not fanout else None
    return Outgoing(queue, message, delay, fanout=fanout)
