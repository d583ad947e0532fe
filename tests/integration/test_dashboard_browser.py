"""The dashboard in a real headless Chromium, fed by a real worker's events.

A worker subprocess (``-E``) and ``celeriac dashboard`` (with basic auth) run on one SQLite
broker; the test sends tasks, some failing, and watches the page update itself: the
worker online, each task reaching its state, the traceback of a failed task, queue
lengths, the state filter. It saves a screenshot and prints its path. A second test
clicks the actions (revoke, terminate, pool +1/-1, a rate limit, shut down) against a
prefork worker, through the page's CSRF-protected POSTs.

Playwright drives Debian's Chromium (``playwright install`` cannot download here). Without
it the test is skipped, except under ``CI=true``, where it fails.

``send_worker_events`` sends, from this process, the events a worker sends for a task.
It let this test run before the worker sent task events, and runs it today with
``DASHBOARD_TEST_EVENTS=dispatcher`` to tell a dashboard bug from a worker one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from celeriac import AsyncResult, Celeriac
from celeriac.events import EventDispatcher
from celeriac.testing import WorkerProcess, wait_until
from tests.integration import app_tasks as t
from tests.services import IN_CI

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
APP = "tests.integration.app_tasks"
USER, PASSWORD = "admin", "correct horse battery staple"
TIMEOUT_MS = 20_000


def require_chromium() -> None:
    if not Path(CHROMIUM).exists():
        message = f"{CHROMIUM} is missing (apt-get install chromium)"
        if IN_CI:
            pytest.fail(f"{message}; CI=true: the browser test must run")
        pytest.skip(message)
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        if IN_CI:
            pytest.fail("playwright is not installed; CI=true: the browser test must run")
        pytest.skip("playwright is not installed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Dashboard:
    """``celeriac dashboard`` as a subprocess, its output in a log file."""

    def __init__(self, env: dict[str, str], cwd: Path, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log_path = cwd / "dashboard.log"
        self.argv = [sys.executable, "-m", "celeriac", "-A", APP, "dashboard", "--port",
                     str(self.port), *args]
        self.env = {**os.environ, **env}
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Dashboard:
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)

        def up() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"dashboard exited ({self.proc.returncode}):\n{self.log}")
            try:
                r = httpx.get(self.url + "api/stats", auth=(USER, PASSWORD), timeout=1)
            except httpx.TransportError:
                return False
            return r.status_code == 200 and bool(r.json()["receiver_connected"])

        wait_until(up, 20, interval=0.1, message="dashboard listening and subscribed")
        return self

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def api(self, path: str) -> Any:
        return httpx.get(self.url + path, auth=(USER, PASSWORD), timeout=5).json()

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, as Ctrl-C or systemd stops it; the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


@pytest.fixture
def dashboard(env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Dashboard]]:
    started: list[Dashboard] = []

    def start(*args: str) -> Dashboard:
        d = Dashboard({**env, "CELERIAC_DASHBOARD_AUTH": f"{USER}:{PASSWORD}"}, tmp_path,
                      *args)
        started.append(d)
        return d.start()

    yield start
    for d in started:
        d.kill()


def send_worker_events(dispatcher: EventDispatcher, result: AsyncResult[Any], name: str,
                       args: tuple[Any, ...], queue: str = "celery") -> None:
    """The task events a worker sends for a finished task, rebuilt from its result."""
    task_id = result.id
    dispatcher.send("task-received", uuid=task_id, name=name, args=repr(args), kwargs="{}",
                    retries=0, eta=None, expires=None, queue=queue, root_id=task_id,
                    parent_id=None)
    dispatcher.send("task-started", uuid=task_id)
    if result.successful():
        dispatcher.send("task-succeeded", uuid=task_id, result=repr(result.result),
                        runtime=0.001)
    else:
        exc = result.result
        dispatcher.send("task-failed", uuid=task_id, exception=repr(exc),
                        traceback=result.traceback or "", runtime=0.001)


def test_dashboard_in_a_browser(app: Celeriac, start_worker: Callable[..., WorkerProcess],
                                dashboard: Callable[..., Dashboard], tmp_path: Path) -> None:
    require_chromium()
    from playwright.sync_api import expect, sync_playwright

    via_dispatcher = os.environ.get("DASHBOARD_TEST_EVENTS") == "dispatcher"
    worker = start_worker("-E", "-c", "2", "-n", "browser@test")
    board = dashboard("--queues", "idle")
    screenshot = tmp_path / "dashboard.png"

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox"])
        try:
            context = browser.new_context(http_credentials={"username": USER,
                                                            "password": PASSWORD},
                                          viewport={"width": 1400, "height": 1000})
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(board.url)
            page.evaluate("window.__sameDocument = true")  # gone if the page reloads
            expect(page.locator("#conn")).to_have_text("live", timeout=TIMEOUT_MS)

            worker_row = page.locator('#workers tr[data-hostname="browser@test"]')
            expect(worker_row.locator(".status")).to_have_text("online", timeout=TIMEOUT_MS)

            ok = [t.add.delay(i, i) for i in range(5)]
            failed = [t.boom.delay("value"), t.boom.delay("value")]
            waiting = [t.add.apply_async((1, 1), queue="idle") for _ in range(3)]
            for r in ok:
                assert r.get(timeout=15) in range(0, 9, 2), worker.log
            for r in failed:
                wait_until(r.ready, 15, message="failing task finished")
            if via_dispatcher:
                dispatcher = EventDispatcher(app, hostname="browser@test")
                try:
                    for r, i in zip(ok, range(5), strict=True):
                        send_worker_events(dispatcher, r, t.add.name, (i, i))
                    for r in failed:
                        send_worker_events(dispatcher, r, t.boom.name, ("value",))
                    assert dispatcher.flush(5)
                finally:
                    dispatcher.close()

            for r in ok:
                row = page.locator(f'#tasks tr[data-uuid="{r.id}"]')
                expect(row).to_have_attribute("data-state", "SUCCESS", timeout=TIMEOUT_MS)
            for r in failed:
                row = page.locator(f'#tasks tr[data-uuid="{r.id}"]')
                expect(row).to_have_attribute("data-state", "FAILURE", timeout=TIMEOUT_MS)
                expect(row.locator("td.name")).to_have_text(t.boom.name)
                expect(row.locator("td.worker")).to_have_text("browser@test")
            expect(page.locator('#queues tr[data-queue="idle"] td.num')).to_have_text(
                str(len(waiting)), timeout=TIMEOUT_MS)
            expect(page.locator('#counts button[data-state="FAILURE"]')).to_have_text(
                "FAILURE 2", timeout=TIMEOUT_MS)

            page.locator(f'#tasks tr[data-uuid="{failed[0].id}"] td.name').click()
            detail = page.locator("#detail")
            expect(detail).to_be_visible()
            expect(detail).to_have_attribute("data-uuid", failed[0].id)
            expect(page.locator("#d-state")).to_have_text("FAILURE")
            expect(page.locator("#d-exception")).to_contain_text("bad value")
            traceback = page.locator("#d-traceback")
            expect(traceback).to_contain_text("Traceback (most recent call last)")
            expect(traceback).to_contain_text("ValueError: bad value")
            expect(page.locator("#d-fields dd.f-worker")).to_have_text("browser@test")
            expect(page.locator("#d-fields dd.f-args")).to_contain_text("value")

            # Event contents are data, never markup.
            hostile = '<img src=x onerror="window.__xss=1">'
            probe = EventDispatcher(app, hostname="<b>evil</b>")
            try:
                probe.send("task-received", uuid="xss-probe", name=hostile,
                           args="('<script>window.__xss=2</script>',)", kwargs="{}")
                assert probe.flush(5)
            finally:
                probe.close()
            row = page.locator('#tasks tr[data-uuid="xss-probe"]')
            expect(row.locator("td.name")).to_have_text(hostile, timeout=TIMEOUT_MS)
            expect(row.locator("td.worker")).to_have_text("<b>evil</b>")
            assert page.locator("#tasks img, #tasks script, #tasks b").count() == 0
            assert page.evaluate("window.__xss") is None

            page.select_option("#f-state", "FAILURE")
            expect(page.locator("#tasks tbody tr")).to_have_count(len(failed))
            page.select_option("#f-state", "")
            expect(page.locator("#tasks tbody tr")).to_have_count(len(ok) + len(failed) + 1)

            expect(page.locator('#counts button[data-state="RECEIVED"]')).to_have_text(
                "RECEIVED 1", timeout=TIMEOUT_MS)  # the probe, counted by the next tick
            page.screenshot(path=str(screenshot), full_page=True)
            print(f"\ndashboard screenshot: {screenshot}")
            assert page.evaluate("window.__sameDocument") is True, "the page reloaded"
            assert errors == [], errors

            stats = board.api("api/stats")
            assert stats["counts"].get("FAILURE") == 2 and stats["counts"].get("SUCCESS") == 5
            assert stats["stream_clients"] == 1
            # A stop must not wait for the browser's never-ending event stream.
            # (uvicorn re-raises the signal once it has shut down cleanly)
            assert board.stop(timeout=5) in (0, -signal.SIGTERM), board.log
            assert "Application shutdown complete" in board.log
            expect(page.locator("#conn")).not_to_have_text("live", timeout=TIMEOUT_MS)
        finally:
            browser.close()
    assert PASSWORD not in board.log


def test_dashboard_actions_in_a_browser(app: Celeriac,
                                        start_worker: Callable[..., WorkerProcess],
                                        dashboard: Callable[..., Dashboard],
                                        tmp_path: Path) -> None:
    """The action buttons, clicked in the page, acting on a real prefork worker through
    the CSRF-protected POSTs: revoke then terminate a running task, pool +1 and -1, a rate
    limit from the form (a bad one refused), and shut the worker down."""
    require_chromium()
    from playwright.sync_api import expect, sync_playwright

    name = "actions@test"
    worker = start_worker("-E", "-c", "2", "-n", name)
    board = dashboard()

    def pool_processes() -> int:
        stats = app.control.inspect(destination=[name], timeout=3).stats() or {}
        return len(stats[name]["pool"]["processes"]) if name in stats else 0

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox"])
        try:
            context = browser.new_context(http_credentials={"username": USER,
                                                            "password": PASSWORD},
                                          viewport={"width": 1400, "height": 1000})
            page = context.new_page()
            errors: list[str] = []
            dialogs: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))

            def accept(dialog: Any) -> None:
                dialogs.append(dialog.message)
                dialog.accept()

            page.on("dialog", accept)
            page.goto(board.url)
            expect(page.locator("#conn")).to_have_text("live", timeout=TIMEOUT_MS)
            worker_row = page.locator(f'#workers tr[data-hostname="{name}"]')
            expect(worker_row.locator(".status")).to_have_text("online", timeout=TIMEOUT_MS)
            status = page.locator("#action-status")

            # Revoke, then Terminate, a task that is running.
            long = t.sleep.delay(30)
            row = page.locator(f'#tasks tr[data-uuid="{long.id}"]')
            expect(row).to_have_attribute("data-state", "STARTED", timeout=TIMEOUT_MS)
            row.locator("td.name").click()
            expect(page.locator("#detail")).to_have_attribute("data-uuid", long.id)
            page.locator("#d-revoke").click()
            expect(status).to_contain_text(f"{name}: tasks {long.id} flagged as revoked",
                                           timeout=TIMEOUT_MS)
            page.locator("#d-terminate").click()
            expect(status).to_contain_text(f"{name}: terminate: {long.id}",
                                           timeout=TIMEOUT_MS)
            expect(row).to_have_attribute("data-state", "REVOKED", timeout=TIMEOUT_MS)
            expect(page.locator("#d-state")).to_have_text("REVOKED", timeout=TIMEOUT_MS)
            expect(page.locator("#d-revoke")).to_be_hidden()  # nothing left to revoke
            assert long.state == "REVOKED"

            # pool +1: the worker's pool grows from 2 to 3; -1 brings it back.
            worker_row.locator("button.act-pool_grow").click()
            expect(status).to_contain_text(f"{name}: pool will grow", timeout=TIMEOUT_MS)
            wait_until(lambda: pool_processes() == 3, 15, interval=0.2, message="pool of 3")
            worker_row.locator("button.act-pool_shrink").click()
            expect(status).to_contain_text(f"{name}: pool will shrink", timeout=TIMEOUT_MS)

            # A rate limit from the form; a bad rate is refused, naming the field.
            page.fill("#r-task", t.add.name)
            page.fill("#r-rate", "fast")
            page.select_option("#r-worker", name)
            page.locator("#r-set").click()
            expect(status).to_contain_text("rate: 'fast' is not a rate", timeout=TIMEOUT_MS)
            expect(status).to_have_attribute("data-ok", "false")
            page.fill("#r-rate", "10/m")
            page.locator("#r-set").click()
            expect(status).to_contain_text(f"{name}: new rate limit set successfully",
                                           timeout=TIMEOUT_MS)
            expect(status).to_have_attribute("data-ok", "true")
            screenshot = tmp_path / "dashboard-actions.png"
            page.screenshot(path=str(screenshot), full_page=True)
            print(f"\ndashboard actions screenshot: {screenshot}")

            # Shut down (confirmed): the worker exits and the page sees it go.
            worker_row.locator("button.act-shutdown").click()
            expect(status).to_contain_text(f"{name}: shutting down", timeout=TIMEOUT_MS)
            assert worker.wait(15) == 0, worker.log
            expect(worker_row.locator(".status")).to_have_text("offline",
                                                               timeout=TIMEOUT_MS)
            assert len(dialogs) == 2 and "Terminate task" in dialogs[0] \
                and "Shut down" in dialogs[1], dialogs
            assert errors == [], errors
        finally:
            browser.close()
    log = board.log
    assert f"pool_grow {name} by 1, by {USER} from 127.0.0.1" in log
    assert f"terminate {long.id} with SIGTERM on {name}, by {USER}" in log
    assert PASSWORD not in log
