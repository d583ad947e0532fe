"""Replaying the dead-letter queue from the dashboard (issue 29), in a real headless
Chromium (as ``test_dashboard_browser.py``): the page lists the dead letters, shows one
whole, requeues one, and purges one and then all, each purge only once its confirmation
is accepted. The dead letters are made as a worker makes them (a consumer fetches
messages for a task nobody knows and dead-letters them), on every broker: SQLite, Redis,
RabbitMQ and SQS (moto), each test on a namespace of its own (results on Redis).

A broker the dashboard cannot read the dead letters from is said so on the page, in
place of the list (not "No dead letters.", not an error page): a Redis namespace whose
dead-letter index is not one is the case here.

One Chromium serves the module's tests (launching it is seconds on a busy box).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from celeriac import AsyncResult, Celeriac
from celeriac.testing import wait_until
from celeriac.transports.base import create_transport
from tests.contracts.conftest import _drop_amqp_namespace, _drop_redis_namespace
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
from tests.services import require, sqs_url

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytestmark = pytest.mark.slow
_ = dashboard  # the fixture

AMQP_NAMES = ("celery", "celeriac.dead", "celeriac.events")


@pytest.fixture(params=["sqlite", "redis", "amqp", "sqs"])
def env(request: pytest.FixtureRequest, env: dict[str, str]) -> Iterator[dict[str, str]]:
    """The integration ``env`` (SQLite) or one on a namespace of its own on a network
    broker, results on Redis; what the test made there deleted after."""
    kind = request.param
    if kind == "sqlite":
        yield env
        return
    ns = f"dl{uuid.uuid4().hex[:12]}"
    results = f"{require('redis')}?namespace={ns}"
    if kind == "sqs":
        # Off this thread: moto's warm-up runs an event loop, and the module's browser
        # (Playwright's sync API) keeps one running on this one.
        with ThreadPoolExecutor(1) as aside:
            broker = aside.submit(sqs_url, ns, fanout_url=require("redis")).result()
    else:
        broker = results if kind == "redis" else f"{require('rabbitmq')}?namespace={ns}"
    yield {**env, "CELERIAC_BROKER_URL": broker, "CELERIAC_RESULT_BACKEND": results,
           "NAMESPACE": ns}
    _drop_redis_namespace(results)
    if kind == "amqp":
        _drop_amqp_namespace(broker, AMQP_NAMES, ("celery",))


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                      args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


def make_dead(app: Celeriac, n: int) -> list[AsyncResult[Any]]:
    sent = [app.send_task("no.such.task", (i,)) for i in range(n)]

    async def kill() -> None:
        consumer = track(create_transport(app.settings.broker_url, app.settings))
        await consumer.connect("dead-maker")
        got: list[Any] = []
        # A broker may hand over fewer than asked for in one fetch (SQS, RabbitMQ).
        for _ in range(20):
            got += await consumer.fetch(["celery"], n - len(got), 5.0)
            if len(got) >= n:
                break
        assert len(got) == n, f"fetched {len(got)} of {n}"
        for d in got:
            await consumer.dead_letter(d, "unknown task 'no.such.task'")
        await consumer.disconnect()
        consumer.close()

    run(kill())
    return sent


def open_page(browser: Browser, board: Dashboard) -> tuple[Page, list[str]]:
    """The dashboard in a new browser context; the page's uncaught errors."""
    context = browser.new_context(http_credentials={"username": USER, "password": PASSWORD})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(board.url)
    return page, errors


def test_dead_letters_listed_inspected_requeued_and_purged_in_the_browser(
        app: Celeriac, dashboard: Callable[..., Dashboard], browser: Browser) -> None:
    from playwright.sync_api import expect

    # The dashboard comes up while the dead letters are made (seconds each on a busy box),
    # these off this thread, where Playwright keeps an event loop running.
    with ThreadPoolExecutor(2) as starting:
        coming = starting.submit(dashboard)
        sent = starting.submit(make_dead, app, 4).result(timeout=60)
        board = coming.result(timeout=60)
    letters = app.transport.dead_letters()
    # SQS orders dead letters by the second they died: ties in any order.
    assert sorted(d.message.headers["id"] for d in letters) == sorted(r.id for r in sent)
    ids = [str(d.id) for d in letters]
    number = {r.id: i for i, r in enumerate(sent)}
    first_task = letters[0].message.headers["id"]

    page, errors = open_page(browser, board)
    try:
        purges: list[str] = []
        page.on("request", lambda r: purges.append(r.url) if "dead_purge" in r.url else None)
        answers: list[bool] = []
        page.on("dialog", lambda d: d.accept() if answers.pop(0) else d.dismiss())
        rows = page.locator("#dead tbody tr")
        expect(rows).to_have_count(4, timeout=TIMEOUT_MS)
        first = page.locator(f'#dead tr[data-id="{ids[0]}"]')
        expect(first.locator("td.task")).to_have_text("no.such.task")
        expect(first.locator("td.task-id")).to_have_text(first_task)
        expect(first.locator("td.reason")).to_contain_text("unknown task")

        # Inspect: the whole message.
        first.locator("button.inspect").click()
        shown = page.locator("#dd-json")
        expect(shown).to_contain_text(f'"id": "{first_task}"')
        expect(shown).to_contain_text('"task": "no.such.task"')
        expect(shown).to_contain_text(f'"body": "[[{number[first_task]}]')

        # Requeue one: back on its queue, gone from the list.
        first.locator("button.requeue").click()
        expect(rows).to_have_count(3, timeout=TIMEOUT_MS)
        expect(page.locator("#action-status")).to_contain_text("1 message(s)")
        wait_until(lambda: app.transport.queue_length("celery") == 1, 10,
                   message="the requeued message on its queue")

        # Purge one: refused at the dialog (nothing sent), then accepted.
        second = page.locator(f'#dead tr[data-id="{ids[1]}"]')
        answers.append(False)
        second.locator("button.purge").click()
        wait_until(lambda: not answers, 10, message="the dialog answered")
        page.evaluate("0")  # the click's handler has run to its end
        assert purges == []
        expect(rows).to_have_count(3)
        answers.append(True)
        second.locator("button.purge").click()
        expect(rows).to_have_count(2, timeout=TIMEOUT_MS)

        # Purge all, confirmed.
        answers.append(True)
        page.locator("#dead-purge-all").click()
        expect(rows).to_have_count(0, timeout=TIMEOUT_MS)
        expect(page.locator("#dead-empty")).to_be_visible()
        expect(page.locator("#dead-error")).to_be_hidden()
        assert errors == [], errors
    finally:
        page.context.close()
    assert app.transport.dead_letters() == []
    assert app.transport.queue_length("celery") == 1  # the requeued one, not purged

    # A purge that does not confirm deletes nothing (the page always confirms first).
    assert "purged 2 dead letter(s), by admin" in board.log
    refused = httpx.post(board.url + "api/actions/dead_purge", json={"all": True},
                         auth=(USER, PASSWORD), timeout=5)
    assert refused.status_code == 403  # and without the CSRF token it is not even read


@pytest.mark.parametrize("env", ["redis"], indirect=True)
def test_a_broker_that_cannot_give_its_dead_letters_is_said_so_on_the_page(
        env: dict[str, str], dashboard: Callable[..., Dashboard], browser: Browser) -> None:
    """The dead-letter index a string (a broken or foreign namespace): Redis refuses to
    read it. The page says so where the list was (not "No dead letters."), without the
    requeue and purge buttons; the API answers 503 naming Redis's refusal, and a purge
    deletes nothing."""
    import redis
    from playwright.sync_api import expect

    client = redis.Redis.from_url(require("redis"))
    try:
        client.set(f"{env['NAMESPACE']}:dead", "not a sorted set")
    finally:
        client.close()
    board = dashboard()
    page, errors = open_page(browser, board)
    try:
        said = page.locator("#dead-error")
        expect(said).to_be_visible(timeout=TIMEOUT_MS)
        expect(said).to_contain_text("Cannot show the dead letters: the broker did not give")
        expect(said).to_contain_text("WRONGTYPE")
        expect(page.locator("#dead-empty")).to_be_hidden()
        expect(page.locator("#dead")).to_be_hidden()
        expect(page.locator("#dead-purge-all")).to_be_hidden()
        assert errors == [], errors
    finally:
        page.context.close()
    listed = httpx.get(board.url + "api/dead", auth=(USER, PASSWORD), timeout=5)
    assert listed.status_code == 503 and "WRONGTYPE" in listed.json()["error"]
    assert "Traceback" in board.log  # for the operator, not the page
