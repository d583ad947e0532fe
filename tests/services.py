"""The real services the suite talks to, and how a test asks for one.

``require("redis")`` returns the service's URL when it answers; otherwise the test is
skipped on a user's machine and fails under ``CI=true`` (CI must not go green by
skipping). Broker-killing tests start their own instances (``tests/faults``), never the
shared ones.
"""

from __future__ import annotations

import os
import socket

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

SERVICES = {
    "redis": ("127.0.0.1", 6379, "redis://127.0.0.1:6379/0"),
    "rabbitmq": ("127.0.0.1", 5672, "amqp://guest:guest@127.0.0.1:5672//"),
    "postgres": ("127.0.0.1", 5432, "postgresql://postgres@127.0.0.1:5432/test"),
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
