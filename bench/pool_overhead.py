"""The prefork pool's own cost per task, next to the raw limit of a pipe round trip.

- raw: a parent and a forked child exchange one small frame over a pair of pipes with
  blocking reads and writes; the time per round trip is the floor any pool pays.
- pool: a ``PreforkPool`` with one child on an event loop runs no-op jobs one after
  another (submit -> child decodes and runs the task -> DONE frame -> ``on_job_done``). The
  task ignores its result, so no backend is involved: what remains is dispatch, framing,
  the child's decode and execute, and the loop's wake-ups. The loop is the one the
  worker runs on: uvloop when it is installed (``Worker.run``), else asyncio's.

Both run sequentially (one job in flight), so each figure is a latency per task. Raw and
pool runs alternate, so that load from other processes drifting over the measurement
weighs on both alike.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
import uuid

import orjson

from celeriac import Celeriac
from celeriac.protocol import task_headers
from celeriac.worker.execute import Job, Outcome
from celeriac.worker.pool.base import NullClient
from celeriac.worker.pool.prefork import PreforkPool


def raw_pipe_round_trip(n: int) -> float:
    """Microseconds per round trip of a 64-byte frame between two Python processes."""
    a_r, a_w = os.pipe()
    b_r, b_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # echo child
        os.close(a_w)
        os.close(b_r)
        while True:
            data = os.read(a_r, 65536)
            if not data:
                os._exit(0)
            os.write(b_w, data)
    os.close(a_r)
    os.close(b_w)
    payload = b"x" * 64
    for _ in range(200):  # warm up
        os.write(a_w, payload)
        os.read(b_r, 65536)
    start = time.perf_counter()
    for _ in range(n):
        os.write(a_w, payload)
        os.read(b_r, 65536)
    elapsed = time.perf_counter() - start
    os.close(a_w)
    os.waitpid(pid, 0)
    os.close(b_r)
    return elapsed / n * 1e6


def pool_round_trip(n: int) -> float:
    """Microseconds per no-op task through a PreforkPool with one child."""
    url = f"memory://{uuid.uuid4().hex}"
    app = Celeriac("bench", broker=url, backend=url)

    @app.task(name="noop", ignore_result=True)
    def noop() -> None:
        return None

    headers = task_headers(task="noop", task_id="x", args_repr="()", kwargs_repr="{}",
                           ignore_result=True)
    body = orjson.dumps([[], {}, {}])

    async def main() -> float:
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()
        count = 0
        total = 200 + n
        started = 0.0

        class Client(NullClient):
            def on_job_done(self, job: Job, outcome: Outcome) -> None:
                nonlocal count, started
                count += 1
                if count == 200:
                    started = time.perf_counter()
                if count == total:
                    finished.set_result(None)
                else:
                    pool.submit(Job(count, headers, body, "application/json", "q", 1, "bench"))

        pool = PreforkPool(app, 1, client=Client())
        await pool.start()
        while pool.free_slots() == 0:
            await asyncio.sleep(0.005)
        pool.submit(Job(0, headers, body, "application/json", "q", 1, "bench"))
        await finished
        elapsed = time.perf_counter() - started
        await pool.stop()
        return elapsed / n * 1e6

    try:
        import uvloop
    except ImportError:
        return asyncio.run(main())
    return float(uvloop.run(main()))


def measure(n: int = 20_000, runs: int = 5) -> dict[str, float]:
    raws, pools = [], []
    for _ in range(runs):
        raws.append(raw_pipe_round_trip(n))
        pools.append(pool_round_trip(n))
    raw, pool = statistics.median(raws), statistics.median(pools)
    return {"raw_us": raw, "pool_us": pool, "ratio": pool / raw}


if __name__ == "__main__":
    result = measure()
    print(f"raw pipe round trip  {result['raw_us']:7.1f} us")
    print(f"prefork pool per task {result['pool_us']:7.1f} us   ({result['ratio']:.2f}x raw)")
