"""The canvas and follow-up tests again, on Redis and on RabbitMQ (results on Redis),
each broker with its own namespace and one worker its tests share (``shared_worker``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.brokers import broker_env
from tests.integration.test_canvas_worker import *  # noqa: F403 - the tests and fixtures
from tests.integration.test_followups import (  # noqa: F401
    test_a_chain_runs_every_step_in_order_passing_results,
    test_callbacks_get_the_result_and_errbacks_the_failure,
    test_what_the_worker_cannot_carry_out_in_full_is_refused_not_half_run,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["redis", "amqp"])
def env(request: pytest.FixtureRequest, module_env: dict[str, str]
        ) -> Iterator[dict[str, str]]:
    """``tests.faults.brokers.env`` for the module: one namespace per broker on the shared
    Redis or RabbitMQ (results on Redis), what its tests made deleted after the last."""
    with broker_env(request.param, module_env) as e:
        yield e
