"""The bench's producer for Huey, run with ``bench/.venv-huey``'s python.

Speaks the line protocol in ``peerlib.py``. Huey has no bulk send (each call is one
LPUSH), so it has no bulk row. Results are read from Huey's result hash directly (one
HMGET per poll) while draining, and with ``result.get(blocking=True)`` for the round
trips (with ``notify_result``, a BLPOP on the task's notification list).
"""

from __future__ import annotations

import time
from typing import Any

import huey_app
import peerlib
import redis
from huey.utils import Error


class Driver:
    def __init__(self) -> None:
        self.redis = redis.Redis.from_url(huey_app.URL)
        self.ids: list[str] = []
        self.poller: peerlib.ResultPoller | None = None

    def reset(self) -> None:
        self.redis.flushdb()  # database 10: the bench's own
        self.ids, self.poller = [], None
        # Connect the client outside the timed parts.
        huey_app.noop()
        self.purge()

    def purge(self) -> None:
        huey_app.huey.flush()

    def enqueue(self, n: int, key: str | None = None, task: str = peerlib.IO) -> None:
        if key is not None:  # the I/O or sleep task; the bench counts its INCRs itself
            call = huey_app.sleep if task == peerlib.SLEEP else huey_app.io
            for _ in range(n):
                call(key)
            return
        noop = huey_app.noop
        self.ids = [noop().id for _ in range(n)]
        self.poller = None

    def wait(self, timeout: float) -> dict[str, Any]:
        if self.poller is None:  # made here, so that enqueue times only the sending
            storage = huey_app.huey.storage

            def fetch(keys: list[str]) -> list[Any]:
                return list(self.redis.hmget(storage.result_key, keys))

            def succeeded(data: bytes) -> bool:
                try:
                    value = huey_app.huey.serializer.deserialize(data)
                except Exception:
                    return False
                return not isinstance(value, Error)

            self.poller = peerlib.ResultPoller(fetch, list(self.ids), succeeded)
        return self.poller.wait(timeout)

    def diag(self) -> dict[str, Any]:
        """Where the missing tasks are, for a failed run's report."""
        storage = huey_app.huey.storage
        return {"queue": self.redis.llen(storage.queue_key), "keys": self.redis.dbsize(),
                "pending": len(self.poller.pending) if self.poller else None}

    def latency(self, count: int, warmup: int, timeout: float) -> dict[str, Any]:
        noop = huey_app.noop
        samples = []
        for i in range(warmup + count):
            t0 = time.perf_counter()
            noop().get(blocking=True, timeout=timeout)
            if i >= warmup:
                samples.append(time.perf_counter() - t0)
        return {"samples": samples}

    def versions(self) -> dict[str, Any]:
        return {"versions": peerlib.versions("huey", "redis")}


def main() -> None:
    driver = Driver()
    peerlib.serve({"reset": driver.reset, "enqueue": driver.enqueue, "purge": driver.purge,
                   "wait": driver.wait, "latency": driver.latency, "diag": driver.diag,
                   "versions": driver.versions})


if __name__ == "__main__":
    main()
