"""The bench's producer for Dramatiq, run with ``bench/.venv-dramatiq``'s python.

Speaks the line protocol in ``peerlib.py``. Dramatiq has no pipelined send; its API for
sending many messages at once is ``dramatiq.group(...).run()``, which is the bulk path.
Results are read from Redis directly (one pipeline of LINDEX per poll) while draining,
and with ``message.get_result(block=True)`` for the round trips.
"""

from __future__ import annotations

import time
from typing import Any

import dramatiq
import dramatiq_app
import peerlib
import redis


class Driver:
    def __init__(self) -> None:
        self.redis = redis.Redis.from_url(dramatiq_app.URL)
        self.messages: list[Any] = []
        self.poller: peerlib.ResultPoller | None = None

    def reset(self) -> None:
        self.redis.flushdb()  # database 13: the bench's own
        self.messages, self.poller = [], None
        # Connect and load the broker's scripts outside the timed parts.
        dramatiq_app.noop.send()
        self.purge()

    def purge(self) -> None:
        dramatiq_app.broker.flush_all()

    def enqueue(self, n: int, key: str | None = None, task: str = peerlib.IO) -> None:
        if key is not None:  # the I/O or sleep task; the bench counts its INCRs itself
            send = (dramatiq_app.sleep if task == peerlib.SLEEP else dramatiq_app.io).send
            self.messages = [send(key) for _ in range(n)]
            return
        send = dramatiq_app.noop.send
        self.messages = [send() for _ in range(n)]
        self.poller = None

    def bulk(self, n: int, batch: int, method: str) -> dict[str, Any]:
        message = dramatiq_app.noop.message
        dramatiq.group(message() for _ in range(n)).run()
        return {"method": "dramatiq.group(noop.message() for _ in range(n)).run()"}

    def wait(self, timeout: float) -> dict[str, Any]:
        if self.poller is None:  # made here, so that enqueue times only the sending
            backend = dramatiq_app.backend

            def fetch(keys: list[str]) -> list[Any]:
                with self.redis.pipeline(transaction=False) as pipe:
                    for key in keys:
                        pipe.lindex(key, 0)
                    return list(pipe.execute())

            def succeeded(data: bytes) -> bool:
                try:
                    backend.unwrap_result(backend.encoder.decode(data))
                except Exception:
                    return False
                return True

            keys = [backend.build_message_key(m) for m in self.messages]
            self.poller = peerlib.ResultPoller(fetch, keys, succeeded)
        return self.poller.wait(timeout)

    def diag(self) -> dict[str, Any]:
        """Where the missing tasks are, for a failed run's report."""
        r = self.redis
        return {"queue": r.llen("dramatiq:default"), "keys": r.dbsize(),
                "pending": len(self.poller.pending) if self.poller else None}

    def latency(self, count: int, warmup: int, timeout: float) -> dict[str, Any]:
        send = dramatiq_app.noop.send
        samples = []
        for i in range(warmup + count):
            t0 = time.perf_counter()
            send().get_result(block=True, timeout=int(timeout * 1000))
            if i >= warmup:
                samples.append(time.perf_counter() - t0)
        return {"samples": samples}

    def versions(self) -> dict[str, Any]:
        return {"versions": peerlib.versions("dramatiq", "redis")}


def main() -> None:
    driver = Driver()
    peerlib.serve({"reset": driver.reset, "enqueue": driver.enqueue, "bulk": driver.bulk,
                   "purge": driver.purge, "wait": driver.wait, "latency": driver.latency,
                   "diag": driver.diag, "versions": driver.versions})


if __name__ == "__main__":
    main()
