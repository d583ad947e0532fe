"""The events sender thread's CPU per event, on Redis, with nobody listening and with a
subscriber (``.venv/bin/python bench/events_sender.py``).

A dispatcher on the bench's Redis database gets ``--events`` task-received events, 30 at
a time (what one turn of a busy worker's consumer hands over), while this thread keeps
the GIL busy between turns as a worker's loop does; the figure is the sender thread's own
CPU time (``/proc``) per event. Linux only.
"""

from __future__ import annotations

import argparse
import os
import time

import redis

from celeriac import Celeriac
from celeriac.events import EVENTS_CHANNEL, EventDispatcher

URL = "redis://127.0.0.1:6379/15?namespace=bench-events"


def thread_cpu(tid: int) -> float:
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(n: int, busy: float) -> tuple[float, int]:
    app = Celeriac("bench-events", broker=URL)
    d = EventDispatcher(app, hostname="bench@host")
    try:
        d.send("worker-online")
        if not d.flush(10):
            raise SystemExit("Redis is not reachable at " + URL)
        assert d._thread is not None
        tid = d._thread.native_id or 0
        before = thread_cpu(tid)
        for _ in range(0, n, 30):
            now = time.time()
            d.put_many([{"type": "task-received", "uuid": "e580d3f1-15a7-457d-9c4b-bef13ea9f8d2",
                         "name": "bench.noop", "args": "()", "kwargs": "{}", "retries": 0,
                         "eta": None, "expires": None, "queue": "celery",
                         "root_id": "e580d3f1-15a7-457d-9c4b-bef13ea9f8d2", "parent_id": None,
                         "timestamp": now} for _ in range(30)])
            end = time.perf_counter() + busy
            while time.perf_counter() < end:  # the loop's own work, holding the GIL
                pass
        if not d.flush(30):
            raise SystemExit("the events did not leave within 30 s")
        return (thread_cpu(tid) - before) / n, d.unheard
    finally:
        d.close()
        app.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=90_000)
    parser.add_argument("--busy", type=float, default=0.0005,
                        help="seconds of busy loop per 30 events (default 0.0005)")
    opts = parser.parse_args()
    alone, unheard = measure(opts.events, opts.busy)
    print(f"nobody listening: {alone * 1e6:.2f} us of sender CPU per event "
          f"({unheard:,} unheard)")
    # The subscriber reads nothing (a reader in this process would take the GIL): Redis
    # buffers for it, up to its pub/sub output limit (32 MB by default), then drops it.
    admin = redis.Redis.from_url(URL.partition("?")[0])
    channel = f"bench-events:bc:{EVENTS_CHANNEL}"
    watcher = admin.pubsub()
    watcher.subscribe(channel)
    try:
        watcher.get_message(timeout=5)  # the subscribe confirmation
        heard, unheard = measure(opts.events, opts.busy)
        if unheard or not dict(admin.pubsub_numsub(channel)).get(channel.encode()):
            raise SystemExit("Redis dropped the subscriber mid-run: use fewer --events")
    finally:
        watcher.close()
        admin.close()
    print(f"a subscriber (not reading): {heard * 1e6:.2f} us of sender CPU per event")


if __name__ == "__main__":
    main()
