"""The dashboard's dead-letter routes (``dashboard/dead.py``) on the memory broker: list,
inspect, requeue and purge, the purge only with ``"confirm": true``, the actions refused
read-only; the page itself is driven in a browser by
``tests/integration/test_flow_dashboard_dead.py``."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest

from celeriac import Celeriac
from celeriac.dashboard import create_app
from tests.loops import run
from tests.unit.test_dashboard_actions import post, token_of

with warnings.catch_warnings():  # this starlette asks for httpx2, which is not installed
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient


def make_dead(app: Celeriac, n: int) -> list[str]:
    """``n`` dead letters (task ids), made as a worker makes them."""
    sent = [app.send_task("no.such.task", (i,)) for i in range(n)]

    async def kill() -> None:
        consumer = app.transport
        await consumer.connect("dead-maker")
        got = await consumer.fetch(["celery"], n, 1.0)
        for d in got:
            await consumer.dead_letter(d, "unknown task 'no.such.task'")
        await consumer.disconnect()

    run(kill())
    return [r.id for r in sent]


@pytest.fixture
def web(memory_app: Celeriac) -> Iterator[TestClient]:
    with TestClient(create_app(memory_app, receive_events=False)) as client:
        yield client


def test_list_inspect_requeue_and_purge(memory_app: Celeriac, web: TestClient) -> None:
    task_ids = make_dead(memory_app, 3)
    listed = web.get("/api/dead").json()
    assert listed["total"] == 3
    assert [d["task_id"] for d in listed["dead"]] == task_ids
    first, second, _ = (d["id"] for d in listed["dead"])
    shown = web.get(f"/api/dead/{first}").json()
    assert shown["headers"]["task"] == "no.such.task" and shown["body"].startswith("[[0]")
    assert shown["reason"] == "unknown task 'no.such.task'"
    assert web.get("/api/dead/nope").status_code == 404

    token = token_of(web)
    r = post(web, "dead_requeue", {"ids": [first]}, token)
    assert r.status_code == 200 and r.json()["count"] == 1
    assert memory_app.transport.queue_length("celery") == 1
    assert post(web, "dead_requeue", {"ids": [first]}, token).status_code == 400  # gone

    refused = post(web, "dead_purge", {"ids": [second]}, token)
    assert refused.status_code == 400 and "confirm" in refused.json()["error"]
    assert web.get("/api/dead").json()["total"] == 2
    assert post(web, "dead_purge", {"ids": [second], "confirm": True}, token).json()[
        "count"] == 1
    assert post(web, "dead_purge", {"all": True, "confirm": True}, token).json()["count"] == 1
    assert web.get("/api/dead").json() == {"dead": [], "total": 0}
    assert memory_app.transport.queue_length("celery") == 1  # the requeued one


@pytest.mark.parametrize("body", [{}, {"ids": []}, {"ids": "1"}, {"ids": [1]},
                                  {"all": "yes"}, {"ids": ["x" * 65]}])
def test_bad_ids_are_refused_naming_the_field(web: TestClient, body: dict[str, object]
                                              ) -> None:
    r = post(web, "dead_requeue", body, token_of(web))
    assert r.status_code == 400 and r.json()["error"].startswith("ids:")


def test_read_only_refuses_requeue_and_purge(memory_app: Celeriac) -> None:
    make_dead(memory_app, 1)
    with TestClient(create_app(memory_app, receive_events=False, read_only=True)) as web:
        for action in ("dead_requeue", "dead_purge"):
            r = post(web, action, {"all": True, "confirm": True}, "any")
            assert r.status_code == 403 and "read-only" in r.json()["error"]
        assert web.get("/api/dead").json()["total"] == 1  # reading is allowed


def test_a_broker_without_dead_letters_answers_501_saying_so(
        memory_app: Celeriac, web: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every broker of ours lists its dead letters: this stands for a third-party one.
    def none(*args: object) -> None:
        raise NotImplementedError("no dead-letter store")

    monkeypatch.setattr(memory_app.transport, "dead_letters", none)
    r = web.get("/api/dead")
    assert r.status_code == 501
    assert r.json()["error"] == ("this broker (MemoryTransport) cannot list dead letters: "
                                 "no dead-letter store")
    assert web.get("/api/dead/1").status_code == 501
    r = post(web, "dead_purge", {"all": True, "confirm": True}, token_of(web))
    assert r.status_code == 501 and "cannot list dead letters" in r.json()["error"]
