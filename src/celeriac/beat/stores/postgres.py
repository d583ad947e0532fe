"""The PostgreSQL store: four tables per namespace (the URL's ``?namespace=``, default
``celeriac``), created on first use under an advisory lock::

    <ns>_beat_lease(id int PRIMARY KEY CHECK (id = 1), holder text, expires timestamptz)
    <ns>_beat_entries(name text PRIMARY KEY, data text)
    <ns>_beat_last(name text PRIMARY KEY, due_ms bigint)
    <ns>_beat_runs(run_key text PRIMARY KEY, name text, due_ms bigint, holder text,
                   claimed_at timestamptz)

The lease is one upsert whose ``WHERE`` lets it through only for a lapsed lease or its
own holder (the server's clock decides). A claim is one transaction: it locks the lease
row ``FOR SHARE`` (a beat taking the lease over waits for the claim to commit, and a
claim after a take-over sees the new holder), moves ``last`` forward only if the due
time is later (a conditional upsert: of two concurrent claims, the second re-checks the
row after the first commits), and inserts the run key ``ON CONFLICT DO NOTHING``; any
refusal rolls it all back. Run keys older than ``RUN_KEY_TTL`` are deleted now and then.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql

from ...backends.postgres import _NAMESPACE, DEFAULT_NAMESPACE
from ...errors import BrokerUnavailable, ConfigurationError, OperationalError
from ..store import LEDGER_LENGTH, RUN_KEY_TTL, BeatStore, Lease, Run, run_key

if TYPE_CHECKING:
    from ...settings import Settings

logger = logging.getLogger("celeriac.beat.postgres")
T = TypeVar("T")
Conn = psycopg.Connection[tuple[Any, ...]]
PRUNE_EVERY = 1000
"""Claims between two deletions of old run keys."""


class _Rollback(Exception):
    """A refused claim: undo what the transaction wrote."""


class PostgresStore(BeatStore):
    def __init__(self, url: str, settings: Settings) -> None:
        super().__init__(url, settings)
        parts = urlsplit(url)
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        ns = dict(pairs).get("namespace", DEFAULT_NAMESPACE)
        if not _NAMESPACE.fullmatch(ns):
            raise ConfigurationError(f"unsafe namespace {ns!r} in beat store URL "
                                     f"{self.safe_url}: use 1-43 letters, digits or '_'")
        self._conninfo = urlunsplit(parts._replace(
            query=urlencode([(k, v) for k, v in pairs if k != "namespace"])))
        self._timeout = max(2, int(settings.broker_connection_timeout))
        self._lock = threading.Lock()  # one connection, one statement at a time
        self._conn: Conn | None = None
        self._ready = False
        self._claims = 0
        self._key = int.from_bytes(hashlib.blake2b(f"celeriac:{ns}_beat".encode(),
                                                   digest_size=8).digest(), "big", signed=True)
        lease, entries, last, runs = (sql.Identifier(f"{ns}_beat_{t}")
                                      for t in ("lease", "entries", "last", "runs"))
        self._tables = [f"{ns}_beat_{t}" for t in ("lease", "entries", "last", "runs")]
        self._ddl = [
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (id int PRIMARY KEY CHECK (id = 1),"
                    " holder text NOT NULL, expires timestamptz NOT NULL)").format(lease),
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (name text PRIMARY KEY, data text NOT NULL)"
                    ).format(entries),
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (name text PRIMARY KEY, due_ms bigint NOT NULL)"
                    ).format(last),
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (run_key text PRIMARY KEY, name text NOT NULL,"
                    " due_ms bigint NOT NULL, holder text NOT NULL,"
                    " claimed_at timestamptz NOT NULL DEFAULT clock_timestamp())").format(runs),
        ]
        self._q_acquire = sql.SQL(
            "INSERT INTO {l} AS l (id, holder, expires) VALUES (1, %(h)s, clock_timestamp()"
            " + make_interval(secs => %(ttl)s)) ON CONFLICT (id) DO UPDATE SET"
            " holder = EXCLUDED.holder, expires = EXCLUDED.expires"
            " WHERE l.holder = EXCLUDED.holder OR l.expires <= clock_timestamp()"
            " RETURNING 1").format(l=lease)
        self._q_release = sql.SQL("DELETE FROM {} WHERE id = 1 AND holder = %s").format(lease)
        self._q_leader = sql.SQL("SELECT holder, extract(epoch FROM expires) FROM {}"
                                 " WHERE expires > clock_timestamp()").format(lease)
        self._q_holds = sql.SQL("SELECT 1 FROM {} WHERE id = 1 AND holder = %s AND"
                                " expires > clock_timestamp() FOR SHARE").format(lease)
        self._q_advance = sql.SQL(
            "INSERT INTO {t} AS t (name, due_ms) VALUES (%s, %s) ON CONFLICT (name) DO UPDATE"
            " SET due_ms = EXCLUDED.due_ms WHERE t.due_ms < EXCLUDED.due_ms RETURNING 1"
        ).format(t=last)
        self._q_record = sql.SQL("INSERT INTO {} (run_key, name, due_ms, holder) VALUES"
                                 " (%s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1"
                                 ).format(runs)
        self._q_prune = sql.SQL("DELETE FROM {} WHERE claimed_at < clock_timestamp()"
                                " - make_interval(secs => %s)").format(runs)
        self._q_last = sql.SQL("SELECT name, due_ms FROM {}").format(last)
        self._q_runs = sql.SQL("SELECT name, due_ms, holder FROM {} ORDER BY claimed_at DESC,"
                               " due_ms DESC LIMIT %s").format(runs)
        self._q_entries = sql.SQL("SELECT name, data FROM {}").format(entries)
        self._q_put = sql.SQL("INSERT INTO {} (name, data) VALUES (%s, %s) ON CONFLICT (name)"
                              " DO UPDATE SET data = EXCLUDED.data").format(entries)
        self._q_remove = sql.SQL("DELETE FROM {} WHERE name = %s").format(entries)
        self._q_remove_last = sql.SQL("DELETE FROM {} WHERE name = %s").format(last)

    def _run(self, op: Callable[[Conn], T]) -> T:
        """``op`` on the connection; a lost connection is re-opened once (every
        operation here may be repeated: a claim whose commit went unconfirmed is refused
        the second time, and its run is not sent: at most once)."""
        with self._lock:
            for attempt in (1, 2):
                try:
                    if self._conn is None or self._conn.closed:
                        self._conn = psycopg.connect(self._conninfo, autocommit=True,
                                                     connect_timeout=self._timeout)
                    if not self._ready:
                        with self._conn.transaction():
                            self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (self._key,))
                            for statement in self._ddl:
                                self._conn.execute(statement)
                        self._ready = True
                    return op(self._conn)
                except psycopg.OperationalError as exc:
                    if self._conn is not None and not self._conn.closed:
                        raise OperationalError(f"PostgreSQL beat store {self.safe_url}: "
                                               f"{exc}") from exc
                    self._conn = None
                    if attempt == 2:
                        raise BrokerUnavailable(f"cannot reach the PostgreSQL beat store "
                                                f"{self.safe_url}: {exc}") from exc
                    logger.warning("lost the connection to %s; reconnecting", self.safe_url)
                except psycopg.errors.UndefinedTable:
                    self._ready = False  # dropped under us
                    if attempt == 2:
                        raise
                except psycopg.Error as exc:
                    raise OperationalError(f"PostgreSQL beat store {self.safe_url}: "
                                           f"{exc}") from exc
        raise AssertionError("unreachable")

    def acquire(self, holder: str, ttl: float) -> bool:
        return self._run(lambda c: c.execute(self._q_acquire, {"h": holder, "ttl": ttl})
                         .fetchone() is not None)

    def release(self, holder: str) -> None:
        self._run(lambda c: c.execute(self._q_release, (holder,)))

    def leader(self) -> Lease | None:
        row = self._run(lambda c: c.execute(self._q_leader).fetchone())
        return Lease(row[0], float(row[1])) if row else None

    def _claim(self, holder: str, name: str, due_ms: int, record: bool) -> bool:
        def op(conn: Conn) -> bool:
            try:
                with conn.transaction():
                    if conn.execute(self._q_holds, (holder,)).fetchone() is None:
                        raise _Rollback
                    if conn.execute(self._q_advance, (name, due_ms)).fetchone() is None:
                        raise _Rollback
                    if record and conn.execute(
                            self._q_record, (run_key(name, due_ms), name, due_ms, holder)
                    ).fetchone() is None:
                        raise _Rollback
            except _Rollback:
                return False
            return True

        claimed = self._run(op)
        self._claims += 1
        if self._claims % PRUNE_EVERY == 0:
            self._run(lambda c: c.execute(self._q_prune, (RUN_KEY_TTL,)))
        return claimed

    def claim(self, holder: str, name: str, due_ms: int) -> bool:
        return self._claim(holder, name, due_ms, True)

    def advance(self, holder: str, name: str, due_ms: int) -> bool:
        return self._claim(holder, name, due_ms, False)

    def last_runs(self) -> dict[str, int]:
        return {n: int(d) for n, d in self._run(lambda c: c.execute(self._q_last).fetchall())}

    def runs(self, limit: int = LEDGER_LENGTH) -> list[Run]:
        rows = self._run(lambda c: c.execute(self._q_runs, (limit,)).fetchall())
        return [Run(n, int(d), h) for n, d, h in rows]

    def entries(self) -> dict[str, bytes]:
        rows = self._run(lambda c: c.execute(self._q_entries).fetchall())
        return {n: d.encode() for n, d in rows}

    def put_entry(self, name: str, data: bytes) -> None:
        self._run(lambda c: c.execute(self._q_put, (name, data.decode())))

    def remove_entry(self, name: str) -> bool:
        def op(conn: Conn) -> bool:
            with conn.transaction():
                conn.execute(self._q_remove_last, (name,))
                return conn.execute(self._q_remove, (name,)).rowcount == 1

        return self._run(op)

    def drop(self) -> None:
        """Delete this namespace's beat tables (tests)."""
        def op(conn: Conn) -> None:
            for table in self._tables:
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))

        self._run(op)
        self._ready = False

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
            self._conn = None
