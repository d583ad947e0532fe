"""Celery's task API on a real (prefork) worker: ``Task.replace`` in a chord, and the
message's properties crossing the pool's pipe into ``self.request``."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from celeriac import Celeriac
from celeriac.canvas import chord
from celeriac.testing import WorkerProcess
from tests.integration import app_tasks as t

pytestmark = pytest.mark.slow  # real worker processes


def test_replace_on_a_prefork_worker(app: Celeriac,
                                     start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker("-c", "2")
    assert t.replaced.delay(1, 2).get(timeout=10) == 3
    assert t.replaced_by_group.delay(1).get(timeout=10) == [2, 3]
    c = chord([t.replaced.s(1, 1), t.replaced_by_group.s(5), t.add.s(2, 2)], t.echo.s())
    assert c.delay().get(timeout=10) == [2, [6, 7], 4]


def test_properties_reach_the_request(app: Celeriac,
                                      start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker("-c", "1")
    r = t.properties.apply_async(app_id="1234", priority=7)
    assert r.get(timeout=10) == {"app_id": "1234", "priority": 7}
