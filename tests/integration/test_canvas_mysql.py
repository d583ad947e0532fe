"""The canvas suite's representative set on MariaDB/MySQL results (``mysql://``, broker
SQLite): chains, groups saved and restored, links and errbacks, chords counted by the
backend, a failed header (the module's own database; its tests share one worker). The
whole suite runs on PostgreSQL (``test_canvas_backends.py``), SQLite, Redis and RabbitMQ;
these are the tests that touch what a result backend does."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.contracts.conftest import _drop_mysql, _mysql_database
from tests.integration.test_canvas_worker import (  # noqa: F401 - the tests and fixtures
    shared_worker,
    test_a_chain_passes_each_result_on_and_links_its_results,
    test_a_chord_runs_its_body_once_with_the_header_results_in_order,
    test_a_failed_header_task_fails_the_chord_naming_it_and_the_body_does_not_run,
    test_a_group_returns_results_in_member_order,
    test_link_and_link_error,
    worker,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def env(module_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[dict[str, str]]:
    results = f"{_mysql_database(tmp_path_factory.getbasetemp())}?namespace=" \
              f"t{uuid.uuid4().hex[:8]}"
    yield {**module_env, "CELERIAC_RESULT_BACKEND": results}
    _drop_mysql(results)
