"""``reply_to`` on a chain's messages with ``rpc://`` results: every step names the
caller's reply queue (as Celery's frozen chains do), so whichever worker sends a later
step, Celery's or ours, sends it to the caller's queue; and a step Celery froze keeps
the queue it names when a celeriac worker sends it. No worker: the messages are read as
built. Across real Celery workers: ``tests/compat/test_rpc_interop.py``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from celeriac import Celeriac, chain, group, signature
from celeriac.canvas import followups
from celeriac.producer import build
from celeriac.protocol import decode_body
from celeriac.serialization import loads
from tests.services import require


@pytest.fixture
def rpc_app() -> Iterator[Celeriac]:
    broker = f"{require('rabbitmq')}?namespace=t{uuid.uuid4().hex[:12]}"
    app = Celeriac("rpc-reply-to", broker=broker, backend="rpc://")
    yield app
    app.close()


def _embed(message: Any) -> dict[str, Any]:
    accept = frozenset({message.content_type})
    return decode_body(loads(message.body, message.content_type, accept))[2]


def test_every_step_of_a_chain_names_the_callers_queue(rpc_app: Celeriac) -> None:
    steps = [signature("t.add", (1, 2), app=rpc_app), signature("t.add", (3,), app=rpc_app),
             signature("t.add", (4,), app=rpc_app).set(queue="elsewhere")]
    item, result = chain(*steps)._outgoing((), {}, {})
    mine = rpc_app.backend.reply_to  # type: ignore[attr-defined]
    assert item.message.properties["reply_to"] == mine
    rest = _embed(item.message)["chain"]
    assert [s["options"]["reply_to"] for s in rest] == [mine, mine]
    assert rest[0]["options"]["task_id"] == result.id  # the last step, sent last
    # A group's members too (Celery freezes them the same way).
    members = group(signature("t.add", (i, i), app=rpc_app) for i in range(2))
    members.freeze()
    assert {m.options["reply_to"] for m in members.tasks} == {mine}


def test_a_step_celery_froze_keeps_its_callers_queue() -> None:
    """What a celeriac worker sends for the next step of a Celery producer's chain: the
    ``reply_to`` Celery froze in the step's options, not a queue of this process."""
    app = Celeriac("followup-reply-to", broker="memory://", backend="memory://")
    try:
        step = {"task": "t.add", "args": [3], "kwargs": {}, "subtask_type": None,
                "immutable": False, "chord_size": None,
                "options": {"task_id": "step-2", "reply_to": "celery-caller-oid"}}
        lineage = {"parent_id": "step-1", "root_id": "step-1"}
        options = followups._send_options(app, "t.add", step["options"], {}, lineage)
        message, _, _ = build(app, "t.add", [1, 3], {}, options, lenient=True)
        assert message.properties["reply_to"] == "celery-caller-oid"
        assert message.headers["id"] == "step-2"
        # Without one, nothing on a backend that is not rpc://.
        bare = followups._send_options(app, "t.add", {"task_id": "step-3"}, {}, lineage)
        assert build(app, "t.add", [1], {}, bare, lenient=True)[0].properties.get(
            "reply_to") is None
    finally:
        app.close()
