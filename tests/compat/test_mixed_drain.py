"""A mixed fleet drains one queue: 10,000 tasks sent by a Celery producer, consumed by
one Celery worker and one celeriac worker together on kombu's Redis layout; every task
has its result (none lost, none run twice that we can see) and both workers took part.
Redis database 11."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from celeriac import Celeriac
from tests.services import require

pytestmark = pytest.mark.slow

DB = 11
PLAIN = f"redis://127.0.0.1:6379/{DB}"
N = 10_000


def test_celery_producer_mixed_fleet_drain(fleet_factory: Any) -> None:
    require("redis")
    redis.Redis(db=DB).flushdb()
    theirs = {"COMPAT_BROKER": PLAIN, "COMPAT_BACKEND": PLAIN, "COMPAT_EXTENDED": "1"}
    ours = {"COMPAT_BROKER": f"{PLAIN}?layout=kombu",
            "COMPAT_BACKEND": f"{PLAIN}?layout=celery", "COMPAT_EXTENDED": "1"}
    fleet_factory.celery_worker(theirs, "drain-celery", "celery", concurrency=2)
    fleet_factory.celeriac_worker(ours, "drain-celeriac", "celery", "-c", "2")
    client = fleet_factory.client(theirs)
    started = time.monotonic()
    ids = client.run(f"out = [proj.noop.delay(i).id for i in range({N})]", timeout=240)
    assert len(set(ids)) == N
    app = Celeriac("drain", broker=f"{PLAIN}?layout=kombu",
                   backend=f"{PLAIN}?layout=celery")
    try:
        done = app.backend.wait_for(ids, timeout=180)
        elapsed = time.monotonic() - started
        missing = [i for i in ids if i not in done]
        assert not missing, f"{len(missing)} of {N} tasks have no result after {elapsed:.0f} s"
        values = {done[i].result for i in ids}
        assert values == set(range(N))
        workers = {str((done[i].extended or {}).get("worker", "")).split("@")[0]
                   for i in ids}
        assert workers == {"drain-celery", "drain-celeriac"}
        store = redis.Redis(db=DB)
        assert store.llen("celery") == 0 and store.hlen("unacked") == 0
        print(f"\n{N} tasks drained by a mixed fleet in {elapsed:.1f} s")
    finally:
        app.close()
