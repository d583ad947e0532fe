"""The canvas and follow-up tests again, on Redis and on RabbitMQ (results on Redis),
each with its own namespace: the same tests, run here with ``tests.faults.brokers.env``."""

from __future__ import annotations

import pytest

from tests.faults.brokers import env  # noqa: F401 - Redis and RabbitMQ, not SQLite
from tests.integration.test_canvas_worker import *  # noqa: F403 - the tests and fixtures
from tests.integration.test_followups import (  # noqa: F401
    test_a_chain_runs_every_step_in_order_passing_results,
    test_callbacks_get_the_result_and_errbacks_the_failure,
    test_what_the_worker_cannot_carry_out_in_full_is_refused_not_half_run,
)

pytestmark = pytest.mark.slow
