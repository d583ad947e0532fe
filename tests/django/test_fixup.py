"""``celeriac.contrib.django``'s fixup, in-process: added once per app when
``DJANGO_SETTINGS_MODULE`` is set, nothing without it; a pool child lets go of its
parent's connections without closing them; tasks run between ``close_old_connections``.
(The whole of it runs in ``test_example.py``: a real worker on the Celery docs' layout.)"""

from __future__ import annotations

import uuid

import pytest

from celeriac import Celeriac
from celeriac.contrib import django as contrib_django
from celeriac.fixups import django as django_fixup
from celeriac.runtime.request import Request
from tests.django import env


def test_fixup_is_added_once_and_only_with_a_settings_module(
        monkeypatch: pytest.MonkeyPatch) -> None:
    env.configure()
    app = Celeriac("t", broker=f"memory://{uuid.uuid4().hex}")
    monkeypatch.delenv("DJANGO_SETTINGS_MODULE", raising=False)
    assert contrib_django.fixup(app) is None
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "configured.in.process")
    first = contrib_django.fixup(app)
    assert first is not None and contrib_django.fixup(app) is first
    app.finalize()  # calls it again: still one
    assert [h for h in app.hooks._hooks if isinstance(h, contrib_django.DjangoFixup)] \
        == [first]


def test_a_child_drops_inherited_connections_without_closing_them() -> None:
    env.configure()
    from django.db import connections

    conn = connections[env.SQLITE_ALIAS]
    conn.ensure_connection()
    raw = conn.connection
    contrib_django.DjangoFixup().worker_process_init()
    assert conn.connection is None
    assert raw in django_fixup._INHERITED  # referenced, so never closed by collection
    with conn.cursor() as cur:  # and Django opens a fresh one when asked
        cur.execute("SELECT 1")
    assert conn.connection is not None and conn.connection is not raw
    conn.close()


def test_tasks_run_between_close_old_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    env.configure()
    import django.db

    calls: list[str] = []
    monkeypatch.setattr(django.db, "close_old_connections", lambda: calls.append("close"))
    hooks = contrib_django.DjangoFixup()
    hooks.before_task(Request(id="a", task="t.x"))
    hooks.after_task(Request(id="a", task="t.x"), "SUCCESS", None)
    hooks.before_task(Request(id="b", task="t.x", is_eager=True))  # inside the caller's
    assert calls == ["close", "close"]                              # transaction: left be
