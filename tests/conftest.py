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

