"""The bench's producer for Celery, run with ``bench/.venv-celery``'s python.

Speaks the line protocol in ``peerlib.py``. The bulk path is measured two ways and both
are reported: ``group(noop.s() x n).apply_async()`` (Celery's API for sending many
tasks at once; it reuses one producer but publishes one message per Redis call), and,
when kombu has it (>= 5.7), ``Producer.batch()`` around ``apply_async(producer=...)``
(kombu pipelines the LPUSHes, ``batch`` per round trip).

The canvas rows use Celery's own API and its Redis backend's defaults: ``group(...)
.apply_async().get()`` and ``chord(header)(body.s()).get()`` (the Redis backend counts a
chord's finished header tasks itself and the last one sends the body).
"""

from __future__ import annotations

import json
import time
from typing import Any

import celery_app
import peerlib
import redis
from celery import chord, group

RESULT_PREFIX = "celery-task-meta-"


class Driver:
    def __init__(self) -> None:
        self.redis = redis.Redis.from_url(celery_app.URL)
        self.app: Any = None
        self.noop: Any = None
        self.ids: list[str] = []
        self.poller: peerlib.ResultPoller | None = None

    def _close(self) -> None:
        if self.app is not None:
            self.app.close()
            self.app = self.noop = None

    def reset(self) -> None:
        self._close()
        self.redis.flushdb()  # database 14: the bench's own
        self.ids, self.poller = [], None
        self.app, self.noop = celery_app.make_app()
        # Connect the producer and the result consumer, declare the queue: outside the
        # timed parts, as the celeriac systems open their connections first.
        self.noop.delay()
        self.purge()

    def purge(self) -> None:
        self.app.control.purge()

    def enqueue(self, n: int, key: str | None = None, task: str = peerlib.IO) -> None:
        if key is not None:  # the I/O or sleep task; the bench counts its INCRs itself
            delay = self.app.tasks[task].delay
            self.ids = [delay(key).id for _ in range(n)]
            return
        delay = self.noop.delay
        self.ids = [delay().id for _ in range(n)]
        self.poller = None

    def bulk(self, n: int, batch: int, method: str) -> dict[str, Any]:
        if method == "group":
            group(self.noop.s() for _ in range(n)).apply_async()
            return {"method": "group(noop.s() for _ in range(n)).apply_async()"}
        with self.app.producer_or_acquire() as producer:
            if not hasattr(producer, "batch"):
                return {"skipped": "kombu has no Producer.batch (< 5.7)"}
            apply_async = self.noop.apply_async
            with producer.batch(batch):
                for _ in range(n):
                    apply_async(producer=producer)
        return {"method": f"with producer.batch({batch}): noop.apply_async(producer=...)"}

    def wait(self, timeout: float) -> dict[str, Any]:
        if self.poller is None:  # made here, so that enqueue times only the sending
            self.poller = peerlib.ResultPoller(
                self.redis.mget, [RESULT_PREFIX + i for i in self.ids],
                lambda v: json.loads(v).get("status") == "SUCCESS")
        return self.poller.wait(timeout)

    def diag(self) -> dict[str, Any]:
        """Where the missing tasks are, for a failed run's report."""
        r = self.redis
        return {"queue": r.llen("celery"), "unacked": r.hlen("unacked"),
                "pending": len(self.poller.pending) if self.poller else None,
                "keys": r.dbsize()}

    def latency(self, count: int, warmup: int, timeout: float) -> dict[str, Any]:
        # A fresh app: its result consumer has no backlog from the drained tasks.
        app, noop = celery_app.make_app()
        try:
            samples = []
            for i in range(warmup + count):
                t0 = time.perf_counter()
                noop.delay().get(timeout=timeout)
                if i >= warmup:
                    samples.append(time.perf_counter() - t0)
            return {"samples": samples}
        finally:
            app.close()

    def canvas_app(self, timeout: float) -> tuple[Any, Any]:
        """A fresh app, for the same reason as ``latency``'s (no backlog of the drained
        tasks' result messages), connected by one untimed round trip."""
        app, noop = celery_app.make_app()
        noop.delay().get(timeout=timeout)
        return app, noop

    def group(self, n: int, timeout: float) -> dict[str, Any]:
        """Send a group of ``n`` no-ops and wait for every result; timed here."""
        app, noop = self.canvas_app(timeout)
        try:
            t0 = time.perf_counter()
            values = group(noop.s() for _ in range(n)).apply_async().get(timeout=timeout)
            seconds = time.perf_counter() - t0
        finally:
            app.close()
        if len(values) != n:
            raise RuntimeError(f"group of {n}: {len(values)} results")
        return {"seconds": seconds}

    def chord(self, m: int, timeout: float) -> dict[str, Any]:
        """A chord of ``m`` no-ops whose body returns the length of the list it gets;
        timed from sending to the body's result."""
        app, noop = self.canvas_app(timeout)
        try:
            collect = app.tasks[celery_app.COLLECT]
            t0 = time.perf_counter()
            value = chord(noop.s() for _ in range(m))(collect.s()).get(timeout=timeout)
            seconds = time.perf_counter() - t0
        finally:
            app.close()
        if value != m:
            raise RuntimeError(f"chord of {m}: the body got {value} results")
        return {"seconds": seconds}

    def ping(self, n: int, count: int, warmup: int, timeout: float) -> dict[str, Any]:
        """``count`` timed ``app.control.ping(limit=n)`` calls (after ``warmup``): each
        from the call until ``n`` workers replied."""
        app, _ = celery_app.make_app()
        try:
            samples = []
            for i in range(warmup + count):
                t0 = time.perf_counter()
                replies = app.control.ping(timeout=timeout, limit=n)
                elapsed = time.perf_counter() - t0
                if len(replies) != n:
                    raise RuntimeError(f"ping: {len(replies)} of {n} workers replied")
                if i >= warmup:
                    samples.append(elapsed)
            return {"samples": samples}
        finally:
            app.close()

    def versions(self) -> dict[str, Any]:
        return {"versions": peerlib.versions("celery", "kombu", "redis")}

    def quit(self) -> None:
        self._close()


def main() -> None:
    driver = Driver()
    try:
        peerlib.serve({"reset": driver.reset, "enqueue": driver.enqueue, "bulk": driver.bulk,
                       "purge": driver.purge, "wait": driver.wait, "latency": driver.latency,
                       "group": driver.group, "chord": driver.chord,
                       "diag": driver.diag, "versions": driver.versions,
                       "ping": driver.ping})
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
