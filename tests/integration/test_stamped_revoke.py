"""``app.control.revoke_by_stamped_headers`` with a real prefork worker on Redis: a
message whose stamps (Celery's ``stamped_headers``/``stamps`` headers) match is refused
(REVOKED, never run), others run; ``terminate=True`` kills a running match; Celery's
reply texts; and the inspect reply shapes Celery's tooling reads (``active``'s decoded
args, ``active_queues``, ``conf``) plus ``app.control.purge()``."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from celeriac import Celeriac, states
from celeriac.control import merge
from celeriac.errors import TaskRevoked
from celeriac.testing import WorkerProcess, wait_until
from tests.integration import app_tasks as t
from tests.services import require

pytestmark = pytest.mark.slow

NODE = "stamps@itest"


@pytest.fixture
def env(env: dict[str, str]) -> Iterator[dict[str, str]]:
    url = f"{require('redis')}?namespace=s{uuid.uuid4().hex[:10]}"
    yield {**env, "CELERIAC_BROKER_URL": url, "CELERIAC_RESULT_BACKEND": url}
    from tests.faults.brokers import _drop_redis_namespace
    _drop_redis_namespace(url)


def _stamped(value: object) -> dict[str, object]:
    return {"stamped_headers": ["monitoring_id"], "stamps": {"monitoring_id": value}}


def test_revoke_by_stamped_headers(app: Celeriac, start_worker: Callable[..., WorkerProcess],
                                   tmp_path: Path) -> None:
    w = start_worker("-n", NODE, "-c", "2")
    ctl = app.control
    target = uuid.uuid4().hex

    # Celery's reply, without terminate.
    got = ctl.revoke_by_stamped_headers({"monitoring_id": [target]}, reply=True,
                                        timeout=10, limit=1)
    assert got == [{NODE: {"ok": f"headers {{'monitoring_id': [{target!r}]}} flagged as "
                                 "revoked, but not terminated"}}]

    # A matching stamp (a value or one of a list of values): REVOKED, never run.
    for value in (target, ["other", target]):
        res = t.add.apply_async((1, 1), headers=_stamped(value))
        with pytest.raises(TaskRevoked):
            res.get(timeout=15)
        assert res.state == states.REVOKED
    # Other stamps, or none: they run.
    assert t.add.apply_async((2, 2), headers=_stamped("someone-else")).get(timeout=15) == 4
    assert t.add.apply_async((3, 3)).get(timeout=15) == 6
    assert "Discarded" in w.log or "revoked" in w.log

    # terminate=True kills a running task whose stamps match; its result is REVOKED.
    marker = tmp_path / "long.pid"
    running_id = uuid.uuid4().hex
    long = t.sleep.apply_async((60, str(marker)), headers=_stamped(running_id))
    wait_until(marker.exists, 15, message="the stamped task started")
    got = ctl.revoke_by_stamped_headers({"monitoring_id": running_id}, terminate=True,
                                        signal="SIGKILL", reply=True, timeout=10, limit=1)
    assert got == [{NODE: {"ok": f"headers {{'monitoring_id': [{running_id!r}]}} revoked"}}]
    with pytest.raises(TaskRevoked):
        long.get(timeout=15)

    # Nothing running matches: Celery's "were not terminated".
    got = ctl.revoke_by_stamped_headers({"monitoring_id": "nobody"}, terminate=True,
                                        reply=True, timeout=10, limit=1)
    assert got == [{NODE: {"ok": "headers {'monitoring_id': 'nobody'} were not "
                                 "terminated"}}]
    # A malformed argument is an error reply naming it; the worker goes on.
    got = ctl.revoke_by_stamped_headers(["no-equals-sign"], reply=True, timeout=10, limit=1)
    assert got is not None and "argument 'headers'" in got[0][NODE]["error"]


def test_inspect_shapes_and_purge(app: Celeriac, start_worker: Callable[..., WorkerProcess],
                                  tmp_path: Path) -> None:
    # purge: the messages waiting in the app's queues, counted, before any worker runs.
    for _ in range(3):
        t.add.delay(1, 2)
    assert app.control.purge() == 3
    assert app.control.purge() == 0

    start_worker("-n", NODE, "-c", "1")
    inspect = app.control.inspect(timeout=10, limit=1)
    marker = tmp_path / "long.pid"
    long = t.sleep.apply_async((30,), {"marker": str(marker)})
    wait_until(marker.exists, 15, message="the task started")
    active = merge(app.control.broadcast("active", reply=True, timeout=10, limit=1))
    assert active is not None
    (info,) = active[NODE]
    assert (info["id"], info["args"], info["kwargs"]) == (long.id, [30],
                                                          {"marker": str(marker)})
    assert info["delivery_info"]["priority"] == 0
    queried = inspect.query_task(long.id)
    assert queried is not None and queried[NODE][long.id][0] == "active"
    assert queried[NODE][long.id][1]["args"] == [30]

    queues = inspect.active_queues()
    assert queues is not None
    (queue,) = queues[NODE]
    assert queue["name"] == queue["routing_key"] == "celery"
    assert queue["exchange"]["name"] == "celery" and queue["bindings"] == []
    assert {"alias", "max_priority", "queue_arguments", "no_declare"} <= set(queue)

    conf = inspect.conf()
    assert conf is not None
    for name in ("worker_hijack_root_logger", "worker_log_color", "accept_content",
                 "enable_utc", "timezone", "broker_url", "result_backend",
                 "broker_heartbeat", "deprecated_settings", "include"):
        assert name in conf[NODE], name
    app.control.revoke(long.id, terminate=True, signal="SIGKILL")
