"""Remote control while the broker restarts (a Redis of the test's own, never the shared
one): a call while it is down fails in one line, the worker subscribes again by itself
and answers once it is back, and its log says so in two lines, not a traceback a second."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from celeriac import Celeriac
from celeriac.errors import OperationalError
from celeriac.testing import WorkerProcess, wait_until
from tests.faults.test_broker_faults import own_redis, use  # noqa: F401 - fixtures
from tests.integration import app_tasks as t

pytestmark = pytest.mark.slow


def test_commands_across_a_redis_restart(
        app: Celeriac, own_redis: Callable[[], None],  # noqa: F811
        use: Callable[..., dict[str, str]],  # noqa: F811
        start_worker: Callable[..., WorkerProcess]) -> None:
    port = own_redis.port  # type: ignore[attr-defined]
    url = f"redis://127.0.0.1:{port}/0"
    use(f"{url}?namespace=b", f"{url}?namespace=r", CELERIAC_WORKER_LEASE_TIMEOUT="1.0",
        CELERIAC_BROKER_CONNECTION_MAX_RETRIES="0")
    w = start_worker("-n", "solo@faults", "-P", "solo")
    assert app.control.ping(destination=["solo@faults"], timeout=5) == [
        {"solo@faults": {"ok": "pong"}}]
    own_redis.stop()  # type: ignore[attr-defined]
    with pytest.raises(OperationalError):
        app.control.ping(timeout=1)
    w.wait_for_log(r"control: subscription lost", 10)
    own_redis.start()  # type: ignore[attr-defined]
    wait_until(lambda: _ping(app), 20, interval=0.2, message="ping after the restart")
    w.wait_for_log(r"control: subscribed again", 5)
    assert t.add.delay(2, 2).get(timeout=20) == 4
    log = w.log
    assert log.count("control: subscription lost") == 1, log
    assert "Traceback" not in log, log


def _ping(app: Celeriac) -> bool:
    try:
        return app.control.ping(destination=["solo@faults"], timeout=1) == [
            {"solo@faults": {"ok": "pong"}}]
    except OperationalError:
        return False
