"""The database connections ``app.transaction()`` takes, behind one ``Adapter``: a
psycopg 3 ``Connection``, Django's connection (or ``using=`` alias), an SQLAlchemy
``Session`` or ``Connection``. Each is recognised by its class's module, so nothing of
psycopg, Django or SQLAlchemy is imported until one of their objects is given.

Every adapter runs SQL with ``%s`` parameters: psycopg's style, which Django's
PostgreSQL backend and SQLAlchemy's PostgreSQL drivers (``exec_driver_sql``) take as is.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, Protocol

from ..errors import ConfigurationError


class Adapter(Protocol):
    """What the outbox needs of a database connection: a transaction block and SQL."""

    def block(self) -> Any:
        """A transaction, or a savepoint inside the one in progress (a context
        manager)."""

    def fetch_one(self, sql: str, params: Sequence[Any]) -> Any:
        """The first column of the first row."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None: ...

    def database(self) -> str:
        """Which database this is (host, port, name), to remember its table by."""


def adapter_for(conn: Any, using: str | None) -> Adapter:
    """The adapter of ``conn`` (or of Django's ``using`` alias); a ``TypeError`` naming
    the argument for anything else."""
    if using is not None:
        if conn is not None:
            raise TypeError("app.transaction(): give conn or using=, not both")
        return DjangoAdapter(using)
    module = type(conn).__module__ or ""
    if module.startswith("psycopg.") or module == "psycopg":
        return PsycopgAdapter(conn)
    if module.startswith("sqlalchemy."):
        return SQLAlchemyAdapter(conn)
    if module.startswith("django."):
        return DjangoAdapter(_django_alias(conn))
    raise TypeError(
        "app.transaction(conn): conn must be a psycopg 3 Connection, Django's "
        "connection (or using='alias'), or an SQLAlchemy Session or Connection; got "
        f"{type(conn).__module__}.{type(conn).__qualname__}")


class PsycopgAdapter:
    def __init__(self, conn: Any) -> None:
        import psycopg  # deferred: the postgres extra

        if not isinstance(conn, psycopg.Connection):
            raise TypeError(f"app.transaction(conn): conn must be a synchronous psycopg "
                            f"Connection, got {type(conn).__qualname__}")
        self.conn: Any = conn

    def block(self) -> Any:
        return self.conn.transaction()

    def fetch_one(self, sql: str, params: Sequence[Any]) -> Any:
        found = self.conn.execute(sql, params).fetchone()
        return found[0] if found else None

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self.conn.execute(sql, params)

    def database(self) -> str:
        info = self.conn.info
        return f"{info.host}:{info.port}/{info.dbname}"


class SQLAlchemyAdapter:
    def __init__(self, target: Any) -> None:
        from sqlalchemy.engine import Connection  # deferred: an optional dependency
        from sqlalchemy.orm import Session

        if not isinstance(target, (Session, Connection)):
            raise TypeError(f"app.transaction(conn): conn must be an SQLAlchemy Session or "
                            f"Connection, got {type(target).__qualname__}")
        self.target: Any = target
        self.session = isinstance(target, Session)
        dialect = target.get_bind().dialect if isinstance(target, Session) else target.dialect
        if dialect.name != "postgresql":
            raise ConfigurationError(f"app.transaction(conn): the outbox needs PostgreSQL, "
                                     f"conn is bound to {dialect.name}")

    def block(self) -> Any:
        target = self.target
        if target.in_transaction():
            return target.begin_nested()
        return target.begin()

    def _conn(self) -> Any:
        return self.target.connection() if self.session else self.target

    def fetch_one(self, sql: str, params: Sequence[Any]) -> Any:
        return self._conn().exec_driver_sql(sql, tuple(params)).scalar()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._conn().exec_driver_sql(sql, tuple(params))

    def database(self) -> str:
        url = self._conn().engine.url
        return f"{url.host}:{url.port}/{url.database}"


def _django_alias(conn: Any) -> str:
    alias = getattr(conn, "alias", None)
    if not isinstance(alias, str):
        raise TypeError("app.transaction(conn): conn must be a Django database connection "
                        f"(django.db.connection or connections[alias]), got {conn!r}")
    return alias


class DjangoAdapter:
    def __init__(self, alias: str) -> None:
        # Deferred (an optional dependency), and typed loosely: Django ships no stubs.
        self.django: Any = importlib.import_module("django.db")
        connections = self.django.connections
        if not isinstance(alias, str) or alias not in connections:
            raise ConfigurationError(f"app.transaction(using=...): no Django database "
                                     f"{alias!r}")
        self.alias = alias
        self.connection: Any = connections[alias]
        if self.connection.vendor != "postgresql":
            raise ConfigurationError(f"app.transaction(using={alias!r}): the outbox needs "
                                     f"PostgreSQL, this database is {self.connection.vendor}")

    def block(self) -> Any:
        return self.django.transaction.atomic(using=self.alias)

    def fetch_one(self, sql: str, params: Sequence[Any]) -> Any:
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()[0]

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)

    def database(self) -> str:
        s = self.connection.settings_dict
        return f"{s.get('HOST')}:{s.get('PORT')}/{s.get('NAME')}"
