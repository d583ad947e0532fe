"""The Lamport clock and ClusterState: ordering, expiry, bounds, statistics."""

from __future__ import annotations

import threading
from typing import Any

import orjson
import pytest

from celeriac.events import ClusterState, LamportClock
from celeriac.events.stats import percentile


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def ev(type_: str, clock: int = 0, timestamp: float = 1000.0, hostname: str = "w1@h",
       pid: int = 100, **fields: Any) -> dict[str, Any]:
    return {"type": type_, "clock": clock, "timestamp": timestamp, "hostname": hostname,
            "pid": pid, "utcoffset": 0, **fields}


# -- Lamport clock ---------------------------------------------------------------------------
def test_clock_forward_counts_up_from_initial() -> None:
    c = LamportClock(5)
    assert c.value == 5
    assert c.forward() == 6
    assert c.forward() == 7
    assert c.value == 7


def test_clock_adjust_takes_the_max_plus_one() -> None:
    c = LamportClock()
    assert c.adjust(10) == 11      # behind: jump past the other
    assert c.adjust(3) == 12       # ahead: still moves forward
    assert c.forward() == 13


def test_clock_is_thread_safe() -> None:
    c = LamportClock()
    seen: list[list[int]] = [[] for _ in range(4)]

    def work(out: list[int]) -> None:
        for _ in range(5000):
            out.append(c.forward())

    threads = [threading.Thread(target=work, args=(s,)) for s in seen]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    values = [v for s in seen for v in s]
    assert c.value == 20_000
    assert len(set(values)) == 20_000


# -- tasks ------------------------------------------------------------------------------------
def test_task_lifecycle_in_order() -> None:
    s = ClusterState()
    s.event(ev("task-received", 1, 1000.0, uuid="t1", name="add", args="(1, 2)",
               kwargs="{}", retries=0, queue="celeriac"))
    assert s.tasks["t1"].state == "RECEIVED"
    s.event(ev("task-started", 2, 1000.1, uuid="t1"))
    assert s.tasks["t1"].state == "STARTED"
    s.event(ev("task-succeeded", 3, 1000.3, uuid="t1", result="3", runtime=0.2))
    t = s.tasks["t1"]
    assert (t.state, t.name, t.worker, t.result, t.runtime) == ("SUCCESS", "add", "w1@h", "3",
                                                                0.2)
    assert (t.received, t.started, t.succeeded) == (1000.0, 1000.1, 1000.3)
    assert t.ready


def test_out_of_order_final_state_wins_and_late_events_only_fill_in() -> None:
    s = ClusterState()
    s.event(ev("task-succeeded", 3, 1000.3, uuid="t1", result="3", runtime=0.2))
    s.event(ev("task-started", 2, 1000.1, uuid="t1"))
    s.event(ev("task-received", 1, 1000.0, uuid="t1", name="add", args="(1, 2)"))
    t = s.tasks["t1"]
    assert t.state == "SUCCESS"           # not moved back
    assert t.name == "add" and t.args == "(1, 2)"   # but merged
    assert t.started == 1000.1 and t.received == 1000.0
    assert t.timestamp == 1000.3 and t.clock == 3
    assert s.tasks_by_type("add") == [t]  # indexed once the name arrived


def test_same_sender_ordered_by_clock_before_timestamp() -> None:
    s = ClusterState()
    # Equal timestamps (a coarse clock): the Lamport clock decides.
    s.event(ev("task-started", 6, 1000.0, uuid="t1"))
    s.event(ev("task-received", 5, 1000.0, uuid="t1", name="add"))
    assert s.tasks["t1"].state == "STARTED"
    assert s.tasks["t1"].name == "add"


def test_task_sent_never_replaces_a_worker_state() -> None:
    s = ClusterState()
    s.event(ev("task-received", 1, 1000.0, uuid="t1", name="add"))
    s.event(ev("task-sent", 9, 999.0, hostname="producer@h", uuid="t1", name="add",
               queue="celeriac"))
    t = s.tasks["t1"]
    assert t.state == "RECEIVED"
    assert t.client == "producer@h" and t.worker == "w1@h" and t.queue == "celeriac"
    assert t.sent == 999.0
    assert "producer@h" not in s.workers  # a producer is not a worker


def test_retry_then_another_worker_runs_it() -> None:
    s = ClusterState()
    s.event(ev("task-received", 10, 1000.0, uuid="t1", name="add"))
    s.event(ev("task-started", 11, 1000.1, uuid="t1"))
    s.event(ev("task-retried", 12, 1000.2, uuid="t1", exception="IOError()"))
    assert s.tasks["t1"].state == "RETRY"
    # w2's clock is far behind w1's: between senders the timestamp decides.
    s.event(ev("task-received", 2, 1001.0, hostname="w2@h", pid=200, uuid="t1", name="add"))
    t = s.tasks["t1"]
    assert (t.state, t.worker) == ("RECEIVED", "w2@h")
    s.event(ev("task-succeeded", 4, 1001.5, hostname="w2@h", pid=200, uuid="t1", runtime=0.4))
    assert s.tasks["t1"].state == "SUCCESS"
    assert [t.uuid for t in s.tasks_by_worker("w2@h")] == ["t1"]
    assert s.tasks_by_worker("w1@h") == []


def test_final_states_ordered_among_themselves() -> None:
    s = ClusterState()
    s.event(ev("task-revoked", 7, 1002.0, uuid="t1", reason="terminated", terminated=True))
    s.event(ev("task-failed", 6, 1001.0, uuid="t1", exception="KeyError('x')"))
    t = s.tasks["t1"]
    assert t.state == "REVOKED" and t.reason == "terminated"
    assert t.exception == "KeyError('x')" and t.failed == 1001.0
    s.event(ev("task-rejected", 8, 1003.0, uuid="t2", reason="unknown task", requeue=False))
    assert s.tasks["t2"].state == "REJECTED"


def test_malformed_events_are_counted_and_ignored() -> None:
    s = ClusterState()
    s.event({"type": "task-received"})           # no uuid
    s.event({"hostname": "x"})                    # no type
    s.event({"type": "worker-online"})            # no hostname
    s.event(ev("custom-thing", uuid="t1"))        # another group
    assert s.event_count == 4
    assert not s.tasks and not s.workers


# -- workers ----------------------------------------------------------------------------------
def test_heartbeats_keep_a_worker_alive_and_expiry_marks_it_offline() -> None:
    clock = FakeClock(1000.0)
    s = ClusterState(clock=clock)
    s.event(ev("worker-online", 1, 1000.0, freq=2.0, active=0, processed=0,
               loadavg=[0.5, 0.4, 0.3], sw_ident="celeriac", sw_ver="1", sw_sys="Linux"))
    w = s.workers["w1@h"]
    assert w.alive and w.status == "online"
    clock.now = 1003.9
    assert w.alive
    clock.now = 1004.1                            # more than freq * 2 without a heartbeat
    assert not w.alive and w.status == "offline"
    assert s.alive_workers() == []
    s.event(ev("worker-heartbeat", 2, 1004.1, freq=2.0, active=3, processed=9))
    assert w.alive and (w.active, w.processed) == (3, 9)
    assert s.alive_workers() == [w]
    assert w.as_dict()["status"] == "online" and w.as_dict()["loadavg"] == [0.5, 0.4, 0.3]


def test_local_received_is_the_sign_of_life_when_present() -> None:
    clock = FakeClock(2000.0)
    s = ClusterState(clock=clock)
    # The sender's clock is an hour behind; the time we received it is what counts.
    s.event(ev("worker-heartbeat", 1, 1000.0 - 3600, freq=2.0, local_received=1999.0))
    assert s.workers["w1@h"].alive


def test_worker_offline_and_stale_heartbeat_does_not_resurrect() -> None:
    s = ClusterState(clock=FakeClock(1000.0))
    s.event(ev("worker-online", 1, 999.0))
    s.event(ev("worker-offline", 5, 1000.0))
    w = s.workers["w1@h"]
    assert not w.alive and w.status == "offline"
    s.event(ev("worker-heartbeat", 4, 999.5))    # older, same process: arrived late
    assert not w.alive


def test_restarted_worker_comes_back_although_its_clock_restarted() -> None:
    s = ClusterState(clock=FakeClock(1000.0))
    s.event(ev("worker-heartbeat", 500, 990.0, pid=100))
    s.event(ev("worker-offline", 501, 991.0, pid=100))
    s.event(ev("worker-online", 1, 999.0, pid=101))
    w = s.workers["w1@h"]
    assert w.alive and w.pid == 101 and w.clock == 1


def test_task_events_are_signs_of_life_too() -> None:
    clock = FakeClock(1000.0)
    s = ClusterState(clock=clock)
    s.event(ev("worker-online", 1, 1000.0, freq=2.0))
    clock.now = 1010.0
    s.event(ev("task-started", 2, 1010.0, uuid="t1"))
    assert s.workers["w1@h"].alive


# -- bounds and indexes -----------------------------------------------------------------------
def test_tasks_are_an_lru_bounded_by_max_tasks_in_memory() -> None:
    s = ClusterState(max_tasks_in_memory=3)
    for i in range(5):
        s.event(ev("task-received", i, 1000.0 + i, uuid=f"t{i}", name="add"))
    assert list(s.tasks) == ["t2", "t3", "t4"]
    s.event(ev("task-started", 10, 1010.0, uuid="t2"))  # an update: most recent now
    s.event(ev("task-received", 11, 1011.0, uuid="t5", name="mul"))
    assert list(s.tasks) == ["t4", "t2", "t5"]
    assert s.task_count == 6
    assert [t.uuid for t in s.tasks_by_type("add")] == ["t2", "t4"]
    assert s.state_counts() == {"RECEIVED": 2, "STARTED": 1}
    assert [t.uuid for t in s.tasks_by_worker("w1@h")] == ["t5", "t2", "t4"]
    assert s.task_types() == ["add", "mul"]      # seen, even when evicted since


def test_workers_bounded_by_max_workers_in_memory() -> None:
    s = ClusterState(max_workers_in_memory=2)
    for i in range(4):
        s.event(ev("worker-heartbeat", 1, 1000.0, hostname=f"w{i}@h"))
    assert list(s.workers) == ["w2@h", "w3@h"]


def test_forget_workers_drops_those_dead_for_longer_than_asked() -> None:
    clock = FakeClock(1000.0)
    s = ClusterState(clock=clock)
    s.event(ev("worker-heartbeat", 1, 1000.0, hostname="gone@h", freq=2.0))
    s.event(ev("worker-heartbeat", 1, 1000.0, hostname="slow@h", freq=30.0))
    s.event(ev("worker-heartbeat", 1, 1050.0, hostname="recent@h", freq=2.0))
    s.event(ev("worker-offline", 2, 1050.0, hostname="recent@h"))
    clock.now = 1064.1  # gone@h expired at 1004, recent@h at 1054, slow@h at 1060
    assert s.forget_workers(60.0) == ["gone@h"]
    assert list(s.workers) == ["slow@h", "recent@h"]
    clock.now = 1114.2
    assert s.forget_workers(60.0) == ["recent@h"]
    clock.now = 1120.2
    assert s.forget_workers(60.0) == ["slow@h"] and not s.workers


def test_a_heartbeat_interval_that_is_not_a_positive_number_is_not_taken() -> None:
    clock = FakeClock(1000.0)
    s = ClusterState(clock=clock)
    for i, freq in enumerate(("2", None, -1, float("nan"), True, 0)):
        s.event(ev("worker-heartbeat", i + 1, 1000.0, freq=freq))
        w = s.workers["w1@h"]
        assert w.freq == 2.0 and w.alive  # judging it never raises
    s.event(ev("worker-heartbeat", 9, 1000.0, freq=0.5))
    clock.now = 1001.1
    assert s.workers["w1@h"].freq == 0.5 and not s.workers["w1@h"].alive


def test_queries_newest_first_with_limit() -> None:
    s = ClusterState()
    for i in range(5):
        s.event(ev("task-received", i, 1000.0 + i, uuid=f"t{i}", name="add"))
    s.event(ev("task-succeeded", 9, 1009.0, uuid="t1", runtime=0.1))
    assert [t.uuid for t in s.tasks_by_type("add", limit=2)] == ["t1", "t4"]
    assert [t.uuid for t in s.tasks_by_state("RECEIVED")] == ["t4", "t3", "t2", "t0"]
    assert [t.uuid for t in s.tasks_by_state("SUCCESS")] == ["t1"]
    assert s.tasks_by_type("nope") == []


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        ClusterState(max_tasks_in_memory=0)


# -- statistics -------------------------------------------------------------------------------
def test_stats_totals_runtimes_and_throughput() -> None:
    clock = FakeClock(1000.0)
    s = ClusterState(clock=clock)
    for i in range(30):                          # one completion a second for 30 s
        clock.now = 1000.0 + i
        s.event(ev("task-received", 2 * i, clock.now, uuid=f"t{i}", name="add"))
        kind = "task-failed" if i % 10 == 0 else "task-succeeded"
        s.event(ev(kind, 2 * i + 1, clock.now, uuid=f"t{i}", runtime=float(i + 1)))
    clock.now = 1030.0
    stats = s.stats()
    assert stats["events"] == 60 and stats["tasks_seen"] == 30
    assert stats["totals"] == {"RECEIVED": 30, "SUCCESS": 27, "FAILURE": 3}
    assert stats["by_task"] == {"add": {"RECEIVED": 30, "SUCCESS": 27, "FAILURE": 3}}
    assert stats["states"] == {"SUCCESS": 27, "FAILURE": 3}
    assert stats["throughput"] == pytest.approx(1.0)
    assert stats["throughput_window"] == pytest.approx(30.0)
    runtime = stats["runtime"]["add"]
    assert runtime["count"] == 30 and runtime["sum"] == pytest.approx(465.0)
    assert runtime["p50"] == 15.0 and runtime["p95"] == 29.0 and runtime["max"] == 30.0
    clock.now = 1200.0                           # nothing completed in the last 60 s
    assert s.stats()["throughput"] == 0.0
    assert s.stats()["throughput_window"] == 60.0
    orjson.dumps(s.snapshot())                   # JSON-able


def test_percentile_nearest_rank() -> None:
    assert percentile([], 0.5) == 0.0
    assert percentile([1.0], 0.95) == 1.0
    values = [float(v) for v in range(1, 21)]
    assert percentile(values, 0.5) == 10.0
    assert percentile(values, 0.95) == 19.0


def test_snapshot_and_clear() -> None:
    s = ClusterState(clock=FakeClock(1000.0))
    s.event(ev("worker-online", 1, 1000.0, freq=2.0))
    for i in range(3):
        s.event(ev("task-received", 2 + i, 1000.0, uuid=f"t{i}", name="add"))
    snap = s.snapshot(task_limit=2)
    assert [t["uuid"] for t in snap["tasks"]] == ["t2", "t1"]
    assert snap["workers"][0]["hostname"] == "w1@h" and snap["workers"][0]["alive"]
    assert snap["stats"]["tasks_in_memory"] == 3 and snap["timestamp"] == 1000.0
    assert "origin" not in snap["tasks"][0]
    s.clear()
    assert not s.tasks and not s.workers and s.event_count == 0 and s.task_types() == []
