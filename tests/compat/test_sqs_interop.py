"""Celery and celeriac on one SQS (moto's server, ``tests/services.py``), in compatibility
mode: a real Celery 5 worker and client (``tests/.venv-celery``, with kombu's SQS
requirements: boto3, pycurl) beside a celeriac worker and this test's celeriac client on
``sqs://...?layout=kombu``; results in Celery's Redis layout (database 3).

Celery reaches moto through boto's ``AWS_ENDPOINT_URL_SQS`` (kombu takes an endpoint
only from the URL's host with ``is_secure`` in ``broker_transport_options``, which the
shared ``celery_proj`` does not set); celeriac through its ``endpoint_url`` parameter.
Each worker has a queue of its own (``to_celery``, ``to_celeriac``); both consume
``mixed``; Celery's also consumes the FIFO queue ``jobs.fifo``."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis

from celeriac import Celeriac
from tests.services import IN_CI, moto_endpoint, require

pytestmark = pytest.mark.slow

DB = 3
PLAIN = f"redis://127.0.0.1:6379/{DB}"
KOMBU_SQS = ("boto3>=1.26.143", "pycurl>=7.43.0.5", "urllib3>=1.26.16")
"""What ``kombu[sqs]`` needs (kombu's SQS consumer reads through pycurl)."""


def _kombu_sqs(venv: Path) -> None:
    python = str(venv / "bin" / "python")
    if subprocess.run([python, "-c", "import boto3, pycurl"], capture_output=True,
                      check=False).returncode == 0:
        return
    done = subprocess.run([python, "-m", "pip", "install", "-q", *KOMBU_SQS],
                          capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        message = f"cannot install kombu's SQS requirements in {venv}: {done.stderr[-2000:]}"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="module")
def ours() -> str:
    return f"sqs://testing:testing@?layout=kombu&endpoint_url={quote(moto_endpoint(), '')}"


@pytest.fixture(scope="module")
def fleet(fleet_factory: Any, ours: str) -> Any:
    require("redis")
    _kombu_sqs(fleet_factory.venv)
    redis.Redis(db=DB).flushdb()
    theirs = {"COMPAT_BROKER": "sqs://", "COMPAT_BACKEND": PLAIN,
              "AWS_ENDPOINT_URL_SQS": moto_endpoint(), "AWS_ACCESS_KEY_ID": "testing",
              "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    fleet_factory.celery_worker(theirs, "celery1", "to_celery,mixed,jobs.fifo", concurrency=2)
    fleet_factory.celeriac_worker({**theirs, "COMPAT_BROKER": ours,
                                   "COMPAT_BACKEND": f"{PLAIN}?layout=celery"},
                                  "celeriac1", "to_celeriac,mixed", "-c", "2")
    fleet_factory.celery = fleet_factory.client(theirs)
    return fleet_factory


@pytest.fixture(scope="module")
def app(fleet: Any, ours: str) -> Iterator[Celeriac]:
    app = Celeriac("compat-sqs", broker=ours, backend=f"{PLAIN}?layout=celery")
    yield app
    app.close()


def test_celery_producer_celeriac_worker(fleet: Any) -> None:
    out = fleet.celery.run("r = proj.who.apply_async((1,), queue='to_celeriac')\n"
                           "out = r.get(timeout=30)", 60)
    assert out == ["celeriac", 1]


def test_celeriac_producer_celery_worker(app: Celeriac, fleet: Any) -> None:
    assert app.send_task("compat.who", [2], queue="to_celery").get(timeout=30) == [
        "celery", 2]
    failed = app.send_task("compat.boom", ["from celery"], queue="to_celery")
    with pytest.raises(ValueError, match="from celery"):
        failed.get(timeout=30)


def test_countdown_and_a_shared_queue(app: Celeriac, fleet: Any) -> None:
    # A countdown waits in SQS (DelaySeconds) and Celery's worker runs it when it comes.
    late = app.send_task("compat.who", [3], queue="to_celery", countdown=1)
    assert late.get(timeout=30) == ["celery", 3]
    # Both fleets drain one queue; every task runs once, by one side or the other.
    results = [app.send_task("compat.who", [i], queue="mixed") for i in range(20)]
    runs = [r.get(timeout=60) for r in results]
    assert sorted(run[1] for run in runs) == list(range(20))
    assert {run[0] for run in runs} <= {"celery", "celeriac"}


def test_fifo_queue_to_a_celery_worker(app: Celeriac, fleet: Any) -> None:
    results = [app.send_task("compat.who", [i], queue="jobs.fifo") for i in range(5)]
    # A countdown to a FIFO queue goes at once with its eta header: Celery holds it.
    late = app.send_task("compat.who", ["late"], queue="jobs.fifo", countdown=1)
    assert [r.get(timeout=30) for r in results] == [["celery", i] for i in range(5)]
    assert late.get(timeout=30) == ["celery", "late"]
