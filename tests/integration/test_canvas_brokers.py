"""The canvas and follow-up tests again, on Redis and on RabbitMQ (results on Redis),
each broker with its own namespace and one worker its tests share (``shared_worker``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.contracts.conftest import _drop_amqp_namespace, _drop_redis_namespace
from tests.faults.brokers import AMQP_NAMES
from tests.integration.test_canvas_worker import *  # noqa: F403 - the tests and fixtures
from tests.integration.test_followups import (  # noqa: F401
    test_a_chain_runs_every_step_in_order_passing_results,
    test_callbacks_get_the_result_and_errbacks_the_failure,
    test_what_the_worker_cannot_carry_out_in_full_is_refused_not_half_run,
)
from tests.services import require

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["redis", "amqp"])
def env(request: pytest.FixtureRequest, module_env: dict[str, str]
        ) -> Iterator[dict[str, str]]:
    """``tests.faults.brokers.env`` for the module: one namespace per broker on the shared
    Redis or RabbitMQ (results on Redis), what its tests made deleted after the last."""
    ns = f"f{uuid.uuid4().hex[:12]}"
    results = f"{require('redis')}?namespace={ns}"
    broker = results if request.param == "redis" else f"{require('rabbitmq')}?namespace={ns}"
    yield {**module_env, "CELERIAC_BROKER_URL": broker, "CELERIAC_RESULT_BACKEND": results}
    _drop_redis_namespace(results)
    if request.param == "amqp":
        _drop_amqp_namespace(broker, AMQP_NAMES, AMQP_NAMES[:2])
