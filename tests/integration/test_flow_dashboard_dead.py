"""Replaying the dead-letter queue from the dashboard (issue 29), in a real headless
Chromium (as ``test_dashboard_browser.py``): the page lists the dead letters, shows one
whole, requeues one, and purges one and then all, each purge only once its confirmation
is accepted. The dead letters are made on the SQLite broker as a worker makes them (a
consumer fetches messages for a task nobody knows and dead-letters them).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from celeriac import AsyncResult, Celeriac
from celeriac.transports.base import create_transport
from tests.integration.test_dashboard_browser import (
    CHROMIUM,
    PASSWORD,
    TIMEOUT_MS,
    USER,
    Dashboard,
    dashboard,
    require_chromium,
)
from tests.loops import run, track

pytestmark = pytest.mark.slow
_ = dashboard  # the fixture


def make_dead(app: Celeriac, n: int) -> list[AsyncResult[Any]]:
    sent = [app.send_task("no.such.task", (i,)) for i in range(n)]

    async def kill() -> None:
        consumer = track(create_transport(app.settings.broker_url, app.settings))
        await consumer.connect("dead-maker")
        got = await consumer.fetch(["celery"], n, 5.0)
        for d in got:
            await consumer.dead_letter(d, "unknown task 'no.such.task'")
        await consumer.disconnect()
        consumer.close()

    run(kill())
    return sent


def test_dead_letters_listed_inspected_requeued_and_purged_in_the_browser(
        app: Celeriac, dashboard: Callable[..., Dashboard]) -> None:
    require_chromium()
    from playwright.sync_api import expect, sync_playwright

    sent = make_dead(app, 4)
    letters = app.transport.dead_letters()
    assert [d.message.headers["id"] for d in letters] == [r.id for r in sent]
    ids = [str(d.id) for d in letters]
    # The dashboard comes up while the browser does (each takes seconds on a busy box).
    with ThreadPoolExecutor(1) as starting, sync_playwright() as pw:
        coming = starting.submit(dashboard)
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox"])
        try:
            board = coming.result(timeout=60)
            context = browser.new_context(http_credentials={"username": USER,
                                                            "password": PASSWORD})
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            answers: list[bool] = []
            page.on("dialog", lambda d: d.accept() if answers.pop(0) else d.dismiss())
            page.goto(board.url)
            rows = page.locator("#dead tbody tr")
            expect(rows).to_have_count(4, timeout=TIMEOUT_MS)
            first = page.locator(f'#dead tr[data-id="{ids[0]}"]')
            expect(first.locator("td.task")).to_have_text("no.such.task")
            expect(first.locator("td.task-id")).to_have_text(sent[0].id)
            expect(first.locator("td.reason")).to_contain_text("unknown task")

            # Inspect: the whole message.
            first.locator("button.inspect").click()
            shown = page.locator("#dd-json")
            expect(shown).to_contain_text(f'"id": "{sent[0].id}"')
            expect(shown).to_contain_text('"task": "no.such.task"')
            expect(shown).to_contain_text('"body": "[[0]')

            # Requeue one: back on its queue, gone from the list.
            first.locator("button.requeue").click()
            expect(rows).to_have_count(3, timeout=TIMEOUT_MS)
            expect(page.locator("#action-status")).to_contain_text("1 message(s)")
            assert app.transport.queue_length("celery") == 1

            # Purge one: refused at the dialog, then accepted.
            second = page.locator(f'#dead tr[data-id="{ids[1]}"]')
            answers.append(False)
            second.locator("button.purge").click()
            page.wait_for_timeout(300)  # the refused dialog sends nothing
            expect(rows).to_have_count(3)
            answers.append(True)
            second.locator("button.purge").click()
            expect(rows).to_have_count(2, timeout=TIMEOUT_MS)

            # Purge all, confirmed.
            answers.append(True)
            page.locator("#dead-purge-all").click()
            expect(rows).to_have_count(0, timeout=TIMEOUT_MS)
            expect(page.locator("#dead-empty")).to_be_visible()
            assert errors == [], errors
        finally:
            browser.close()
    assert app.transport.dead_letters() == []
    assert app.transport.queue_length("celery") == 1  # the requeued one, not purged

    # A purge that does not confirm deletes nothing (the page always confirms first).
    assert "purged 2 dead letter(s), by admin" in board.log
    refused = httpx.post(board.url + "api/actions/dead_purge", json={"all": True},
                         auth=(USER, PASSWORD), timeout=5)
    assert refused.status_code == 403  # and without the CSRF token it is not even read
