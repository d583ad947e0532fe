"""Children dying together: the pool's own bookkeeping must never stop the worker.

Two tasks that crash their children at the same moment used to kill the worker: a dead
child's pipe descriptors were closed while it was still listed, the replacement's new
pipes got the same numbers, and the replacement closed them (EBADF / BrokenPipeError at
start), which counted as more deaths until the restart-storm guard stopped the worker.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from celeriac import Celeriac, WorkerLostError
from celeriac.testing import WorkerProcess, wait_until
from tests.faults.brokers import env  # noqa: F401 - Redis and RabbitMQ
from tests.integration import app_tasks as t

pytestmark = pytest.mark.slow


def dead_ids(app: Celeriac) -> set[str]:
    return {d.message.headers.get("id") for d in app.transport.dead_letters(1000)}


def test_two_children_crashing_at_once_ten_fresh_workers(
        app: Celeriac, start_worker: Callable[..., WorkerProcess]) -> None:
    """The soak: each round a fresh -c 2 worker gets an os._exit and a segfault at once;
    it survives every round, dead-letters both after their last delivery, and runs a
    good task after them."""
    for round_ in range(10):
        w = start_worker("-c", "2", extra_env={"CELERIAC_TASK_REDELIVERY_DELAY": "0.05"})
        crashes = [t.exit_child.delay(1), t.segfault.delay()]
        for r in crashes:
            with pytest.raises(WorkerLostError, match=r"\(delivery 3 of 3\)"):
                r.get(timeout=30)
        assert t.add.delay(round_, 1).get(timeout=15) == round_ + 1
        assert w.proc is not None and w.proc.poll() is None, w.log
        crashed = {r.id for r in crashes}
        wait_until(lambda c=crashed: dead_ids(app) >= c, 10, message="both dead-lettered")
        log = w.log
        assert "Bad file descriptor" not in log and "BrokenPipeError" not in log, log
        assert "pool children died" not in log, log
        assert w.stop() == 0, log
