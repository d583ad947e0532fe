from __future__ import annotations

import importlib.util
import os
import sys
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



def pytest_configure(config: pytest.Config) -> None:
    _keep_rewritten_tests(config)
    _share_moto(config)


def _keep_rewritten_tests(config: pytest.Config) -> None:
    """Let pytest keep its rewritten test modules (``__pycache__``, git-ignored) when the
    environment forbids bytecode (``PYTHONDONTWRITEBYTECODE``): pytest reads that cache
    either way but never writes it then, so each pytest-xdist process rewrote the asserts
    of every test module again, 15-20 s of CPU a process (three of them on two CPUs), the
    largest part of the fast tier's start. The previous value comes back at the end."""
    if not sys.dont_write_bytecode:
        return
    sys.dont_write_bytecode = False

    def restore() -> None:
        sys.dont_write_bytecode = True

    config.add_cleanup(restore)


def _share_moto(config: pytest.Config) -> None:
    """Under pytest-xdist, one moto server for every worker process, started here in the
    controller (in the background, while the workers start and collect) and named to
    them by ``CELERIAC_TEST_SQS_ENDPOINT``: started by each of them (``moto_endpoint``),
    it cost each its own start, seconds of CPU on a loaded machine (14 s seen in a test's
    setup). Tests keep apart by their queue namespaces, as on one real SQS account."""
    if hasattr(config, "workerinput") or os.environ.get("CELERIAC_TEST_SQS_ENDPOINT"):
        return
    if not getattr(config.option, "numprocesses", None) or config.option.collectonly:
        return
    if importlib.util.find_spec("moto") is None:
        return  # each test that needs it skips (fails under CI) as without xdist
    from tests.services import start_moto, stop_moto

    proc, endpoint = start_moto()
    os.environ["CELERIAC_TEST_SQS_ENDPOINT"] = endpoint

    def stop() -> None:
        os.environ.pop("CELERIAC_TEST_SQS_ENDPOINT", None)
        stop_moto(proc)

    config.add_cleanup(stop)
