from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from celeriac import Celeriac

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture
def memory_app() -> Iterator[Celeriac]:
    """An app on a fresh in-process broker and result store."""
    url = f"memory://{uuid.uuid4().hex}"
    app = Celeriac("t", broker=url, backend=url, worker_lease_timeout=2.0)
    yield app
    app.close()


@pytest.fixture
def sqlite_url(tmp_path: object) -> str:
    return f"sqlite:///{tmp_path}/celeriac.db"


# Tests that share state outside a namespace of their own run in one xdist worker, one
# after another (`make test` runs the suite in two processes, `--dist loadgroup`): the
# compatibility tests speak Celery's layout, which has no namespace (the queue "celery"
# on RabbitMQ's default vhost, fixed Redis databases).
SERIAL_GROUPS = {"compat": "compat"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.nodeid.split("/")
        group = SERIAL_GROUPS.get(parts[1]) if len(parts) > 2 and parts[0] == "tests" else None
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
