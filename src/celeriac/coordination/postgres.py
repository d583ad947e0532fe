"""The shared store in the PostgreSQL result backend's database.

Two tables per namespace (the URL's ``?namespace=``, as for results), created on first
use under an advisory lock::

    <ns>_buckets(name text PRIMARY KEY, tokens float8, stamp float8, granted int)
    <ns>_leases(name text PRIMARY KEY, owner text, expires float8)

``take`` is one ``UPDATE ... RETURNING``: the row lock orders concurrent callers, and
under READ COMMITTED a caller that waited for the lock re-evaluates its SET expressions
against the row as the previous caller left it, so the arithmetic (``base.bucket_take``
in SQL) always starts from the latest state. ``granted`` is a column only so that
RETURNING can report what this statement took. The clock is the server's
(``statement_timestamp()``). ``acquire`` is one upsert whose DO UPDATE applies only when
the caller holds the lease or it has expired.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql

from .._net import mask_password
from ..errors import BrokerUnavailable, ConfigurationError, OperationalError
from .base import Grant, SharedStore, check_args

Conn = psycopg.Connection[tuple[Any, ...]]
_NAMESPACE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,42}")
NOW = "extract(epoch FROM statement_timestamp())::float8"


class PostgresStore(SharedStore):
    kind = "PostgreSQL"

    def __init__(self, url: str, connect_timeout: float = 4.0) -> None:
        self.safe_url = mask_password(url)
        parts = urlsplit(url)
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        ns = dict(pairs).get("namespace", "celeriac")
        if not _NAMESPACE.fullmatch(ns):
            raise ConfigurationError(f"unsafe namespace {ns!r} in {self.safe_url}: use 1-43 "
                                     "letters, digits or '_', not starting with a digit")
        rest = [(k, v) for k, v in pairs if k != "namespace"]
        self._conninfo = urlunsplit(parts._replace(query=urlencode(rest)))
        self._timeout = max(2, round(connect_timeout))
        self.tables = (f"{ns}_buckets", f"{ns}_leases")
        b, le = (sql.Identifier(t) for t in self.tables)
        self._ddl = [
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (name text PRIMARY KEY, tokens float8 "
                    "NOT NULL, stamp float8 NOT NULL, granted int NOT NULL DEFAULT 0)"
                    ).format(b),
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (name text PRIMARY KEY, owner text "
                    "NOT NULL, expires float8 NOT NULL)").format(le),
        ]
        now = sql.SQL(NOW)
        avail = sql.SQL("least(%(cap)s, tokens + greatest(0, {now} - stamp) * %(rate)s)"
                        ).format(now=now)
        take = sql.SQL("greatest(0, least(%(want)s, floor({a} + 1e-9)))::int").format(a=avail)
        self._q_take = sql.SQL(
            "UPDATE {b} SET granted = {take}, tokens = greatest(0, {a} - {take}),"
            " stamp = greatest(stamp, {now}) WHERE name = %(name)s RETURNING granted, tokens"
        ).format(b=b, take=take, a=avail, now=now)
        self._q_bucket = sql.SQL("INSERT INTO {} (name, tokens, stamp) VALUES "
                                 "(%(name)s, %(cap)s, {now}) ON CONFLICT DO NOTHING"
                                 ).format(b, now=now)
        self._q_acquire = sql.SQL(
            "INSERT INTO {le} AS l (name, owner, expires) VALUES (%s, %s, {now} + %s)"
            " ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner,"
            " expires = EXCLUDED.expires WHERE l.owner = EXCLUDED.owner OR l.expires <= {now}"
            " RETURNING 1").format(le=le, now=now)
        self._q_release = sql.SQL("DELETE FROM {} WHERE name = %s AND owner = %s").format(le)
        self._q_holder = sql.SQL("SELECT owner FROM {} WHERE name = %s AND expires > {now}"
                                 ).format(le, now=now)
        self._local = threading.local()
        self._conns: list[tuple[int, Conn]] = []
        """Every connection opened (pid, connection): ``close`` closes this process's,
        those of threads that have ended included."""
        self._lock = threading.Lock()
        self._ready = False

    def _conn(self) -> Conn:
        conn: Conn | None = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid() and not conn.closed:
            return conn
        try:
            conn = psycopg.connect(self._conninfo, autocommit=True,
                                   connect_timeout=self._timeout)
        except psycopg.Error as exc:
            raise BrokerUnavailable(f"cannot connect to PostgreSQL at {self.safe_url}: "
                                    f"{exc}") from exc
        if not self._ready:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.tables[0],))
                for statement in self._ddl:
                    conn.execute(statement)
            self._ready = True
        self._local.conn, self._local.pid = conn, os.getpid()
        with self._lock:
            self._conns = [(p, c) for p, c in self._conns if not c.closed]
            self._conns.append((os.getpid(), conn))
        return conn

    def _execute(self, query: sql.Composed, params: Any) -> list[tuple[Any, ...]]:
        for attempt in (1, 2):
            conn = self._conn()
            try:
                cur = conn.execute(query, params)
                return cur.fetchall() if cur.description else []
            except psycopg.OperationalError as exc:
                if not conn.closed or attempt == 2:
                    raise OperationalError(f"PostgreSQL at {self.safe_url}: {exc}") from exc
                # The connection dropped (a server restart): every statement here may be
                # repeated, so try once more on a new one.
                self._local.conn = None
            except psycopg.Error as exc:
                raise OperationalError(f"PostgreSQL at {self.safe_url}: {exc}") from exc
        raise AssertionError("unreachable")

    def take(self, name: str, rate: float, capacity: float, want: int) -> Grant:
        check_args(rate, capacity, want)
        params = {"name": name, "rate": rate, "cap": float(capacity), "want": want}
        rows = self._execute(self._q_take, params)
        if not rows:  # the first take of this name: a full bucket, then take from it
            self._execute(self._q_bucket, params)
            rows = self._execute(self._q_take, params)
        granted, tokens = int(rows[0][0]), float(rows[0][1])
        wait = 0.0 if granted >= want else \
            max(0.0, min(want - granted, capacity) - tokens) / rate
        return Grant(granted, wait)

    def acquire(self, name: str, owner: str, ttl: float) -> bool:
        return bool(self._execute(self._q_acquire, (name, owner, ttl)))

    def release(self, name: str, owner: str) -> None:
        self._execute(self._q_release, (name, owner))

    def holder(self, name: str) -> str | None:
        rows = self._execute(self._q_holder, (name,))
        return str(rows[0][0]) if rows else None

    def close(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
        for pid, conn in conns:
            if pid == os.getpid():  # a forked child must not end its parent's sessions
                conn.close()
        self._local = threading.local()
