"""One Django configuration per test process, for the tests that need Django in-process
(the ``django-db`` contract runs, the beat scheduler's tests).

Django's settings are process-wide and configured once: ``default`` is a SQLite file of
this process's own, ``pg`` a PostgreSQL database of this process's own (pytest-xdist runs
several processes; each test runs alone in its process). django-celery-results' and
django-celery-beat's tables are made once per database, from their models.
"""

from __future__ import annotations

import atexit
import os
import tempfile
from pathlib import Path

SQLITE_ALIAS = "default"
PG_ALIAS = "pg"
APPS = ("django_celery_results", "django_celery_beat")
_migrated: set[tuple[str, str]] = set()
_made: set[str] = set()
_PG_PREFIX = "celeriac_django_pid"


def pg_server() -> str:
    """The shared PostgreSQL server's URL, without a database (``require`` first)."""
    from tests.services import require

    return require("postgres").rsplit("/", 1)[0]


def _pg_name(pid: int | None = None) -> str:
    return f"{_PG_PREFIX}{pid or os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def create_pg_database() -> None:
    """This process's PostgreSQL database, made on first use (dropped at exit)."""
    import psycopg

    if "pg" in _made:
        return
    name = _pg_name()
    with psycopg.connect(f"{pg_server()}/postgres", autocommit=True) as admin:
        # Those of test processes that are gone (pytest-xdist's workers may exit before
        # their atexit handlers run); names carry the process id.
        for (old,) in admin.execute("SELECT datname FROM pg_database WHERE datname LIKE "
                                    "%s", (_PG_PREFIX + "%",)).fetchall():
            pid = old[len(_PG_PREFIX):]
            if pid.isdigit() and not _alive(int(pid)):
                admin.execute(f'DROP DATABASE IF EXISTS "{old}" WITH (FORCE)')
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    atexit.register(_drop_pg, name)
    _made.add("pg")


def _drop_pg(name: str) -> None:
    import psycopg

    try:
        with psycopg.connect(f"{pg_server()}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except Exception as exc:  # the server may be gone at exit
        print(f"could not drop database {name}: {exc}")


def configure() -> None:
    """Configure Django for this process (once); the ``pg`` alias when PostgreSQL answers
    (a test on it calls ``require("postgres")``, which skips or fails without, then
    ``create_pg_database()``)."""
    import django
    from django.conf import settings

    from tests.services import SERVICES, reachable

    if settings.configured:
        return
    postgres = reachable(*SERVICES["postgres"][:2])
    tmp = Path(tempfile.mkdtemp(prefix="celeriac-django-"))
    # WAL: a commit need not wait for the disk (the contract's expiry windows are short).
    sqlite_options = {"timeout": 20,
                      "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL"}
    databases = {SQLITE_ALIAS: {"ENGINE": "django.db.backends.sqlite3",
                                "NAME": str(tmp / "django.db"), "OPTIONS": sqlite_options}}
    if postgres:
        server = pg_server()
        databases[PG_ALIAS] = {
            "ENGINE": "django.db.backends.postgresql", "NAME": _pg_name(),
            "USER": "postgres", "HOST": server.split("@")[-1].split(":")[0],
            "PORT": server.rsplit(":", 1)[-1]}
    settings.configure(DATABASES=databases, INSTALLED_APPS=list(APPS), USE_TZ=True,
                       TIME_ZONE="UTC", DEFAULT_AUTO_FIELD="django.db.models.AutoField")
    django.setup()


def create_tables(alias: str, apps: tuple[str, ...] = APPS) -> None:
    """``apps``' tables in ``alias`` (once), made from their models' current state with
    Django's schema editor: the schema their migrations end at, in a fraction of the
    time (``test_example.py`` runs the migrations themselves)."""
    from django.apps import apps as registry
    from django.db import connections

    conn = connections[alias]
    existing = set(conn.introspection.table_names())
    for app in apps:
        if (alias, app) in _migrated:
            continue
        with conn.schema_editor() as editor:
            for model in registry.get_app_config(app).get_models():
                if model._meta.db_table not in existing:
                    editor.create_model(model)
        _migrated.add((alias, app))


def empty(alias: str) -> None:
    """Delete every row of the tables a test may have written (its own process's DB)."""
    from django.db import connections

    with connections[alias].cursor() as cur:
        for table in ("django_celery_results_taskresult", "django_celery_results_groupresult",
                      "django_celery_results_chordcounter"):
            cur.execute(f"DELETE FROM {table}")
    connections[alias].close()
