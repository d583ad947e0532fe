"""A chord header task revoked before it arrives (issue 29): the worker counts its part
(``REVOKED``), so the chord's body fails with ``ChordError`` as Celery's does, and it
counts it **before** the message is acknowledged, so a worker that dies between leaves
the message to come again and be counted then (``worker/revoking.py``). End to end with
a real worker on Redis; the order with the real Redis transport and backend."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celeriac import AsyncResult, Celeriac, GroupResult, chord, states
from celeriac.errors import ChordError, TaskRevoked
from celeriac.producer import SendOptions, build
from celeriac.protocol import Delivery
from celeriac.worker import revoking
from tests.integration import unique_followups_tasks as ut
from tests.integration.support import bound, redis_env, workers

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def env() -> Iterator[dict[str, str]]:
    with redis_env("rcm") as e:
        yield e


@pytest.fixture(scope="module")
def app(env: dict[str, str]) -> Iterator[Celeriac]:
    with bound(ut.app, env) as a:
        yield a


def test_a_chord_whose_member_was_revoked_before_it_arrived_fails_its_body(
        app: Celeriac, env: dict[str, str], tmp_path: Path) -> None:
    revoked = uuid.uuid4().hex
    app.control.revoke(revoked)  # in the shared store: a worker started later honours it
    with workers("tests.integration.unique_followups_tasks", env, tmp_path) as w:
        w.start("-c", "2")
        result = chord([ut.first.si(), ut.collect.si(1).set(task_id=revoked)],
                       ut.collect.s()).apply_async()
        # The body's own outcome (a get that follows parents raises the member's first).
        with pytest.raises(ChordError, match=f"Dependency {revoked} raised REVOKED"):
            result.get(timeout=30, follow_parents=False)
        with pytest.raises(TaskRevoked):
            result.get(timeout=5)
    assert AsyncResult(revoked, app).state == states.REVOKED


def _header_message(app: Celeriac, group_id: str, member: str, body: dict[str, Any]
                    ) -> Any:
    message, _, _ = build(app, ut.collect.name, [1], {}, SendOptions(
        task_id=member, group_id=group_id, group_index=1, embed={"chord": body}))
    return message


async def _fetch(app: Celeriac, queue: str, timeout: float) -> Delivery:
    found = await app.transport.fetch([queue], 1, timeout)
    assert len(found) == 1, f"nothing came from {queue} within {timeout}s"
    return found[0]


def test_the_part_is_counted_before_the_message_is_acknowledged(
        app: Celeriac, monkeypatch: pytest.MonkeyPatch) -> None:
    other, member, body_id = (uuid.uuid4().hex for _ in range(3))
    group_id, queue = uuid.uuid4().hex, f"rcm{uuid.uuid4().hex[:8]}"
    GroupResult(group_id, [AsyncResult(other, app), AsyncResult(member, app)], app).save()
    backend = app.backend
    assert not backend.store_part(backend.encode(other, states.SUCCESS, 1), group_id, 2)
    body = {"task": ut.collect.name, "args": [], "kwargs": {}, "options": {"task_id": body_id},
            "subtask_type": None, "immutable": False, "chord_size": 2}
    app.publisher.publish(queue, _header_message(app, group_id, member, body))
    # A count that fails (here a chord size no backend can count): not acknowledged,
    # back in the queue after the delay, to be counted then.
    broken = uuid.uuid4().hex
    app.publisher.publish(queue, _header_message(app, uuid.uuid4().hex, broken,
                                                 {**body, "chord_size": "many"}))
    monkeypatch.setattr(revoking, "RECOUNT_DELAY", 0.2)

    async def scenario() -> list[Any]:
        await app.transport.connect(f"rcm-{uuid.uuid4().hex[:6]}")
        seen: list[Any] = []
        try:
            d = await _fetch(app, queue, 5.0)
            assert d.message.headers["id"] == member
            # What the result backend holds as the ack is asked for: the body's outcome
            # (the count that completed the chord stored its ChordError) is there.
            await revoking.revoked_on_arrival(app, app.transport, d, "revoked",
                                              lambda done: seen.append(backend.get(body_id)))
            await app.transport.ack([d])
            d = await _fetch(app, queue, 5.0)
            assert d.message.headers["id"] == broken
            await revoking.revoked_on_arrival(app, app.transport, d, "revoked",
                                              lambda done: seen.append("acked"))
            again = await _fetch(app, queue, 10.0)
            assert again.message.headers["id"] == broken
            await app.transport.ack([again])
        finally:
            await app.transport.disconnect()
        return seen

    seen = asyncio.run(scenario())
    assert len(seen) == 1  # the broken one was never acknowledged
    assert seen[0] is not None and seen[0].state == states.FAILURE
    assert "REVOKED" in str(seen[0].result)
    assert backend.get(member).state == states.REVOKED
