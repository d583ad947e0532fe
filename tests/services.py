"""The real services the suite talks to, and how a test asks for one.

``require("redis")`` returns the service's URL when it answers; otherwise the test is
skipped on a user's machine and fails under ``CI=true`` (CI must not go green by
skipping). Broker-killing tests start their own instances (``tests/faults``), never the
shared ones.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlencode

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

SERVICES = {
    "redis": ("127.0.0.1", 6379, "redis://127.0.0.1:6379/0"),
    "rabbitmq": ("127.0.0.1", 5672, "amqp://guest:guest@127.0.0.1:5672//"),
    "postgres": ("127.0.0.1", 5432, "postgresql://postgres@127.0.0.1:5432/test"),
    "mysql": ("127.0.0.1", 3306, "mysql://root@127.0.0.1:3306/test"),
}


def reachable(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def require(name: str) -> str:
    host, port, url = SERVICES[name]
    if not reachable(host, port):
        message = f"{name} is not reachable on {host}:{port}"
        if IN_CI:
            pytest.fail(f"{message} (CI=true: services must be up; `make test` starts them)")
        pytest.skip(message)
    return url


_MOTO: list[tuple[object, str]] = []
# moto's SQS server, with the two fixes scripts/moto_sqs.py gives it (tests only).
_MOTO_MAIN = Path(__file__).resolve().parents[1] / "scripts" / "moto_sqs.py"


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    """moto's SQS server started on a free loopback port (not waited for), and its
    endpoint."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(_MOTO_MAIN), "-H", "127.0.0.1",
                             "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}"


def stop_moto(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def moto_endpoint() -> str:
    """The endpoint of moto's SQS server, started once per test process on a free
    loopback port (``CELERIAC_TEST_SQS_ENDPOINT`` names one already running, as
    ``tests/conftest.py`` does for pytest-xdist's processes), stopped when the process
    exits. Skips (fails under CI) without ``moto[server]``."""
    if _MOTO:
        return _MOTO[0][1]
    given = os.environ.get("CELERIAC_TEST_SQS_ENDPOINT")
    proc = None
    if given:
        endpoint = given
    else:
        try:
            import moto.server  # noqa: F401
        except ImportError as exc:
            if IN_CI:
                pytest.fail(f"moto[server] is not installed ({exc}); the dev extra has it")
            pytest.skip(f"moto[server] is not installed: {exc}")
        proc, endpoint = start_moto()
        atexit.register(stop_moto, proc)
    # A server named by the environment may still be starting (tests/conftest.py's).
    host, _, port = endpoint.rpartition("/")[2].partition(":")
    deadline = time.monotonic() + 30
    while not reachable(host, int(port or 80), 0.2):
        if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
            if proc is not None:
                stop_moto(proc)
            pytest.fail(f"moto's server did not start at {endpoint}")
        time.sleep(0.05)  # sleep-ok: polling the port under the deadline
    _MOTO.append((proc, endpoint))
    _warm_up(endpoint)
    return endpoint


def _warm_up(endpoint: str) -> None:
    """Import the AWS clients and load SQS's model once per test process (seconds on a
    loaded machine), so no test's timed section pays for it."""
    from celeriac.settings import Settings
    from celeriac.transports.sqs.client import AsyncClient, SyncClient
    from celeriac.transports.sqs.config import parse

    config = parse(f"sqs://testing:testing@?endpoint_url={endpoint}", Settings())
    SyncClient(config, 5.0).close()

    async def aio() -> None:
        client = AsyncClient(config, {}, 5.0)
        await client.open()
        await client.close()

    asyncio.run(aio())


def sqs_url(namespace: str, **options: str) -> str:
    """An ``sqs://`` URL on moto's server, its queues named with ``namespace``."""
    query = urlencode({"endpoint_url": moto_endpoint(), "namespace": namespace, **options})
    return f"sqs://testing:testing@?{query}"
