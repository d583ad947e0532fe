"""The canvas suite on the result backends the broker tests do not cover: PostgreSQL
(broker SQLite) here; SQLite, Redis (with Redis and RabbitMQ brokers) run the same tests
in test_canvas_worker.py and test_canvas_brokers.py, and the memory backend in
test_canvas_memory.py. Chord counting is each backend's own atomic operation."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.contracts.conftest import _drop_postgres_table
from tests.integration.test_canvas_worker import *  # noqa: F403 - the tests and fixtures
from tests.services import require

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def env(module_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """The module's namespace: its tests share one worker (``shared_worker``)."""
    results = f"{require('postgres')}?namespace=t{uuid.uuid4().hex[:12]}"
    yield {**module_env, "CELERIAC_RESULT_BACKEND": results}
    _drop_postgres_table(results)
