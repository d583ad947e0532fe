"""The dashboard's actions: CSRF rules, validation, read-only mode, and real replies from a
``ThreadedWorker`` on the memory broker."""

from __future__ import annotations

import logging
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from celeriac import Celeriac
from celeriac.cli import main
from celeriac.dashboard import create_app
from celeriac.dashboard.actions import COOKIE, Csrf, same_origin
from celeriac.testing import ThreadedWorker, wait_until

with warnings.catch_warnings():  # this starlette asks for httpx2, which is not installed
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

USER, PASSWORD = "ops", "s3cret-pass"
W = "w1@h"


@pytest.fixture
def app(memory_app: Celeriac) -> Celeriac:
    @memory_app.task(name="dash.add")
    def add(x: int, y: int) -> int:
        return x + y

    return memory_app


def client_for(app: Celeriac, **kwargs: Any) -> TestClient:
    return TestClient(create_app(app, receive_events=False, **kwargs))


@pytest.fixture
def web(app: Celeriac) -> Iterator[TestClient]:
    with client_for(app) as client:
        client.app.state.actions.timeout = 2.0  # type: ignore[attr-defined]
        yield client


@pytest.fixture
def worker(app: Celeriac) -> Iterator[ThreadedWorker]:
    w = ThreadedWorker(app, hostname=W).start()
    yield w
    w.stop()


def token_of(client: TestClient) -> str:
    r = client.get("/")
    assert r.status_code == 200
    token: str = client.cookies[COOKIE]
    return token


def post(client: TestClient, action: str, body: Any, token: str | None,
         **headers: str) -> Any:
    h = {"X-CSRF-Token": token} if token is not None else {}
    return client.post(f"/api/actions/{action}", json=body, headers={**h, **headers})


# -- CSRF ------------------------------------------------------------------------------------
@pytest.fixture
def calls(app: Celeriac, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Control calls made (none may be made by a refused request)."""
    made: list[str] = []
    for name in ("revoke", "pool_grow", "pool_shrink", "rate_limit", "shutdown"):
        monkeypatch.setattr(app.control, name,
                            lambda *a, _n=name, **k: made.append(_n) or [{W: {"ok": _n}}])
    return made


@pytest.mark.parametrize(("case", "reason"), [
    ("no token", "missing X-CSRF-Token"),
    ("forged token", "invalid CSRF token"),
    ("header differs from cookie", "does not match the celeriac_csrf cookie"),
    ("no cookie", "does not match the celeriac_csrf cookie"),
    ("other origin", "Origin does not match Host"),
    ("null origin", "Origin does not match Host"),
    ("cross-site fetch", "Sec-Fetch-Site: cross-site"),
    ("same-site fetch", "Sec-Fetch-Site: same-site"),
    ("form", "Content-Type must be application/json"),
    ("text/plain", "Content-Type must be application/json"),
])
def test_csrf_refusals(web: TestClient, calls: list[str], case: str, reason: str) -> None:
    token = token_of(web)
    url = "/api/actions/pool_grow"
    body = {"worker": W}
    if case == "no token":
        r = post(web, "pool_grow", body, None)
    elif case == "forged token":
        web.cookies.set(COOKIE, "nonce.0123abcd")
        r = post(web, "pool_grow", body, "nonce.0123abcd")
    elif case == "header differs from cookie":
        r = post(web, "pool_grow", body, Csrf().new_token(None))
    elif case == "no cookie":
        web.cookies.clear()
        r = post(web, "pool_grow", body, token)
    elif case == "other origin":
        r = post(web, "pool_grow", body, token, Origin="http://evil.example")
    elif case == "null origin":
        r = post(web, "pool_grow", body, token, Origin="null")
    elif case == "cross-site fetch":
        r = post(web, "pool_grow", body, token, **{"Sec-Fetch-Site": "cross-site"})
    elif case == "same-site fetch":
        r = post(web, "pool_grow", body, token, **{"Sec-Fetch-Site": "same-site"})
    elif case == "form":
        r = web.post(url, data=body, headers={"X-CSRF-Token": token})
    else:
        r = web.post(url, content=b'{"worker": "w1@h"}',
                     headers={"X-CSRF-Token": token, "Content-Type": "text/plain"})
    assert r.status_code == 403, r.text
    assert reason in r.json()["error"]
    assert calls == []
    # GET never acts
    assert web.get(url).status_code == 405


def test_same_origin_and_fresh_token(web: TestClient, calls: list[str]) -> None:
    # What a browser sends for the page's own fetch.
    token = token_of(web)
    r = post(web, "pool_grow", {"worker": W}, token, Origin="http://testserver",
             **{"Sec-Fetch-Site": "same-origin"})
    assert r.status_code == 200, r.text
    # A client that never loaded the page asks /api/csrf (which sets the cookie too).
    web.cookies.clear()
    r = web.get("/api/csrf")
    assert r.headers["cache-control"] == "no-store"
    assert post(web, "shutdown", {"worker": W}, r.json()["token"]).status_code == 200
    assert calls == ["pool_grow", "shutdown"]


def test_cookie_attributes(web: TestClient) -> None:
    cookie = web.get("/").headers["set-cookie"]
    assert cookie.startswith(COOKIE + "=")
    attrs = {a.strip().lower() for a in cookie.split(";")[1:]}
    assert {"path=/", "samesite=strict"} <= attrs
    assert "httponly" not in attrs  # the page's script reads it


def test_tokens_are_signed_per_process_and_user() -> None:
    a, b = Csrf(), Csrf()
    token = a.new_token("alice")
    assert a.valid(token, "alice")
    assert not a.valid(token, "bob") and not a.valid(token, None)
    assert not b.valid(token, "alice")  # another process (or a restart)
    assert not a.valid("no-dot", "alice") and not a.valid(".", "alice")


def test_same_origin() -> None:
    assert same_origin("http://a.example:5555", "a.example:5555")
    assert same_origin("http://A.example", "a.example:80")
    assert same_origin("https://a.example", "a.example")
    assert same_origin("http://[::1]:5555", "[::1]:5555")
    assert not same_origin("http://a.example:5556", "a.example:5555")
    assert not same_origin("https://a.example", "a.example:80")
    assert not same_origin("null", "a.example")
    assert not same_origin("http://a.example", "")


# -- real replies --------------------------------------------------------------------------
def test_actions_reach_a_real_worker(web: TestClient, worker: ThreadedWorker,
                                     caplog: pytest.LogCaptureFixture) -> None:
    token = token_of(web)
    with caplog.at_level(logging.INFO, "celeriac.dashboard.actions"):
        r = post(web, "rate_limit", {"task_name": "dash.add", "rate": "10/m", "worker": W},
                 token)
        assert r.status_code == 200, r.text
        assert r.json() == {"action": "rate_limit", "ok": True,
                            "replies": {W: {"ok": "new rate limit set successfully"}}}
        # no worker named: every worker (the one alive here answers)
        r = post(web, "rate_limit", {"task_name": "nope", "rate": 5}, token)
        assert r.json() == {"action": "rate_limit", "ok": False,
                            "replies": {W: {"error": "rate_limit: unknown task 'nope'"}}}
        # the worker's own refusal comes back as it is
        r = post(web, "pool_grow", {"worker": W, "n": 2}, token)
        assert r.status_code == 200 and r.json()["ok"] is False
        assert "cannot be resized" in r.json()["replies"][W]["error"]
        task_id = str(uuid.uuid4())
        r = post(web, "revoke", {"task_id": task_id, "worker": W}, token)
        assert r.json()["replies"] == {W: {"ok": f"tasks {task_id} flagged as revoked"}}
        assert task_id in worker.worker.revoked
        r = post(web, "shutdown", {"worker": W}, token)
        assert r.json()["replies"] == {W: {"ok": "shutting down"}}
    wait_until(lambda: worker.exit_code is not None, 10, message="worker stopped")
    lines = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("rate_limit dash.add to 10/m on w1@h, by - from") for m in lines)
    assert any(m.startswith(f"revoke {task_id} on w1@h") for m in lines)
    assert any(m.startswith("shutdown w1@h") for m in lines)


def test_no_reply_is_504(web: TestClient) -> None:
    web.app.state.actions.timeout = 0.2  # type: ignore[attr-defined]
    r = post(web, "pool_shrink", {"worker": "nobody@h"}, token_of(web))
    assert r.status_code == 504
    assert r.json()["error"] == "no reply from nobody@h within 0.2 s"


def test_user_is_logged_never_the_password(app: Celeriac, calls: list[str],
                                           caplog: pytest.LogCaptureFixture) -> None:
    with client_for(app, auth=(USER, PASSWORD)) as web:
        web.auth = (USER, PASSWORD)
        with caplog.at_level(logging.INFO, "celeriac.dashboard"):
            r = post(web, "revoke", {"task_id": "t-1", "terminate": True, "signal": "kill",
                                     "worker": W}, token_of(web))
            assert r.status_code == 200, r.text
            assert post(web, "revoke", {"task_id": "t-2"}, "x.y").status_code == 403
    assert calls == ["revoke"]
    text = caplog.text
    assert "terminate t-1 with SIGKILL on w1@h, by ops from" in text
    assert "revoke refused: X-CSRF-Token does not match" in text and "user ops" in text
    assert PASSWORD not in text


# -- validation -----------------------------------------------------------------------------
@pytest.mark.parametrize(("action", "body", "field"), [
    ("revoke", {}, "task_id"),
    ("revoke", {"task_id": 5}, "task_id"),
    ("revoke", {"task_id": "a\nb"}, "task_id"),
    ("revoke", {"task_id": "x" * 256}, "task_id"),
    ("revoke", {"task_id": "a", "terminate": "yes"}, "terminate"),
    ("revoke", {"task_id": "a", "signal": "SIGSEGV"}, "signal"),
    ("revoke", {"task_id": "a", "signal": 9}, "signal"),
    ("pool_grow", {}, "worker"),
    ("pool_grow", {"worker": W, "n": 0}, "n"),
    ("pool_shrink", {"worker": W, "n": "1"}, "n"),
    ("pool_shrink", {"worker": W, "n": True}, "n"),
    ("pool_grow", {"worker": W, "n": 101}, "n"),
    ("rate_limit", {"rate": "10/m"}, "task_name"),
    ("rate_limit", {"task_name": "dash.add"}, "rate"),
    ("rate_limit", {"task_name": "dash.add", "rate": "fast"}, "rate"),
    ("rate_limit", {"task_name": "dash.add", "rate": "10/d"}, "rate"),
    ("rate_limit", {"task_name": "dash.add", "rate": "-1/s"}, "rate"),
    ("rate_limit", {"task_name": "dash.add", "rate": "10/m", "worker": 3}, "worker"),
    ("shutdown", {"worker": ""}, "worker"),
    ("shutdown", [W], "body"),
])
def test_bad_input_names_the_field(web: TestClient, calls: list[str], action: str,
                                   body: Any, field: str) -> None:
    r = post(web, action, body, token_of(web))
    assert r.status_code == 400, r.text
    assert r.json()["error"].startswith(field + ":")
    assert calls == []


def test_body_not_json(web: TestClient, calls: list[str]) -> None:
    token = token_of(web)
    r = web.post("/api/actions/shutdown", content=b"{nope",
                 headers={"X-CSRF-Token": token, "Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"] == "body: not JSON"
    r = web.post("/api/actions/shutdown", content=b" " * 20_000,
                 headers={"X-CSRF-Token": token, "Content-Type": "application/json"})
    assert r.status_code == 413
    assert calls == []


# -- read-only --------------------------------------------------------------------------------
def test_read_only(app: Celeriac, calls: list[str]) -> None:
    with client_for(app) as on:
        assert on.get("/api/config").json() == {"actions": True}
    with client_for(app, read_only=True) as web:
        assert web.get("/api/config").json() == {"actions": False}
        r = web.get("/")
        assert COOKIE not in r.headers.get("set-cookie", "")
        token = web.get("/api/csrf").json()["token"]
        for action in ("revoke", "pool_grow", "pool_shrink", "rate_limit", "shutdown"):
            r = post(web, action, {"worker": W, "task_id": "a"}, token)
            assert r.status_code == 403
            assert r.json()["error"] == "the dashboard is read-only (--read-only)"
    assert calls == []


def test_cli_read_only_option(monkeypatch: pytest.MonkeyPatch) -> None:
    got: dict[str, Any] = {}

    def fake_create_app(app: Celeriac, **kwargs: Any) -> Any:
        got.update(kwargs)
        raise SystemExit(0)  # stop before serving

    monkeypatch.setattr("celeriac.dashboard.create_app", fake_create_app)
    result = CliRunner().invoke(main, ["-A", "tests.integration.app_tasks", "dashboard",
                                       "--read-only"], env={"CELERIAC_BROKER_URL":
                                                            "memory://cli-read-only"})
    assert result.exit_code == 0, result.output
    assert got["read_only"] is True
