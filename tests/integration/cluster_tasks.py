"""Tasks of the cluster tests (test_cluster.py, test_global_rate.py, test_health.py),
run by real worker processes: a globally limited task that returns when it started, a
long task, and a hook that makes every worker a candidate in the election "singleton"
(Gossip logs who wins)."""

from __future__ import annotations

import time
from typing import Any

from celeriac import Celeriac, Hooks, Settings

app = Celeriac("cluster", settings=Settings.from_env())


@app.task(global_rate_limit="50/s")
def metered(i: int) -> float:
    return time.time()


@app.task(bind=True, global_rate_limit="30/s", rate_limit="20/s")
def doubly(self: Any, i: int) -> tuple[float, str]:
    return time.time(), self.request.hostname


@app.task(track_started=True)
def nap(seconds: float) -> str:
    time.sleep(seconds)  # sleep-ok: the task's own work
    return "rested"


class Candidate(Hooks):
    def after_worker_start(self, worker: Any) -> None:
        gossip = getattr(worker, "gossip", None)
        if gossip is not None:
            gossip.election("singleton")


app.add_hooks(Candidate())
