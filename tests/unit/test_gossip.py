"""Gossip: the live set on a fake clock (join and leave, each with one log line; a
worker silent for twice its heartbeat interval leaves; a burst of events costs work in
proportion to its size, a bounded log and, a minute after, no memory), and elections
between two threaded workers on one memory broker (one leader; the other takes over
when it stops)."""

from __future__ import annotations

import logging
import uuid

import pytest

from celeriac import Celeriac
from celeriac.testing import ThreadedWorker, wait_until
from celeriac.worker.gossip import FORGET_AFTER, LOG_LINES, LiveSet


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def beat(host: str, kind: str = "heartbeat", freq: float = 2.0, pid: int = 1,
         clock: int = 1) -> dict[str, object]:
    return {"type": f"worker-{kind}", "hostname": host, "freq": freq, "pid": pid,
            "clock": clock, "timestamp": 0.0}


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "celeriac.worker.gossip"]


def test_a_worker_joins_once_and_leaves_after_twice_its_heartbeat_interval(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "celeriac.worker.gossip")
    clock = Clock()
    live = LiveSet("me@h", clock)
    live.event(beat("w2@h", "online"))
    live.event(beat("w2@h", clock=2))
    assert live.live == {"w2@h"}
    assert lines(caplog) == ["w2@h joined (1 other worker(s) live)"]
    clock.now += 3.9
    live.check()
    assert live.live == {"w2@h"}  # within 2 x freq (4 s)
    clock.now += 0.2
    live.check()
    assert live.live == frozenset()
    assert lines(caplog)[1] == "w2@h left (no heartbeat for 4.1s; 0 other worker(s) live)"
    live.event(beat("w2@h", clock=3))  # back: joins again
    assert live.live == {"w2@h"} and len(lines(caplog)) == 3


def test_offline_leaves_at_once_and_own_and_task_events_are_ignored(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "celeriac.worker.gossip")
    live = LiveSet("me@h", Clock())
    live.event(beat("me@h", "online"))
    live.event({"type": "task-succeeded", "hostname": "w3@h", "uuid": "x"})
    assert live.live == frozenset()
    live.event(beat("w2@h", "online", freq=0.5))
    live.event(beat("w3@h", "online"))
    live.event(beat("w2@h", "offline", clock=2))
    assert live.live == {"w3@h"}
    assert lines(caplog)[-1] == "w2@h left (offline; 1 other worker(s) live)"


def test_the_heartbeat_interval_each_worker_sends_is_the_one_it_is_judged_by() -> None:
    clock = Clock()
    live = LiveSet("me@h", clock)
    live.event(beat("fast@h", freq=0.5))
    live.event(beat("slow@h", freq=5.0))
    clock.now += 1.5
    live.check()
    assert live.live == {"slow@h"}


class CountingClock(Clock):
    """Counts its readings: judging whether a worker is alive reads the clock, so the
    count is the number of judgements (plus one reading per event received)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


def burst(live: LiveSet, n: int, hosts: int) -> None:
    for i in range(n):
        live.event(beat(f"fake{i % hosts}@burst", clock=i + 1))


@pytest.mark.parametrize("distinct", [True, False], ids=["distinct-hosts", "one-host"])
def test_a_burst_costs_work_in_proportion_to_its_size(distinct: bool) -> None:
    # Issue 24: each event used to re-judge every known worker, so 10x the events of
    # distinct hosts cost 100x the work (10,000 froze a worker's loop for 12 s).
    reads = []
    for n in (300, 3000):
        clock = CountingClock()
        live = LiveSet("me@h", clock)
        burst(live, n, n if distinct else 1)
        reads.append(clock.reads)
        assert len(live.live) == (n if distinct else 1)
    small, big = reads
    assert big <= 2 * 3000 + 2, reads  # at most two readings per event
    assert big <= 11 * small, reads  # 10x the events, ~10x the work


def test_a_burst_logs_a_bounded_number_of_lines_and_counts_the_rest(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "celeriac.worker.gossip")
    clock = Clock()
    live = LiveSet("me@h", clock)
    burst(live, 1000, 1000)
    assert len(lines(caplog)) == LOG_LINES
    live.check()
    assert lines(caplog)[-1] == (f"{1000 - LOG_LINES} more worker(s) joined and 0 left, "
                                 "not logged one by one (1000 other worker(s) live)")
    clock.now += 4.1  # all silent: they leave, again LOG_LINES lines and a summary
    live.check()
    assert live.live == frozenset()
    assert len(lines(caplog)) == 2 * LOG_LINES + 2
    assert lines(caplog)[-1].startswith(f"0 more worker(s) joined and {1000 - LOG_LINES} left")


def test_hosts_seen_once_are_forgotten_a_while_after_they_left() -> None:
    clock = Clock()
    live = LiveSet("me@h", clock)
    burst(live, 1000, 1000)
    live.event(beat("real@h", freq=60.0))  # judged by its own, longer, interval
    clock.now += 4.1 + FORGET_AFTER - 1
    live.check()
    assert live.live == {"real@h"} and len(live.state.workers) == 1001  # left, known
    clock.now += 2
    live.check()
    assert live.live == {"real@h"} and list(live.state.workers) == ["real@h"]


def test_a_worker_pushed_out_of_memory_by_newer_ones_leaves_at_the_next_check(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "celeriac.worker.gossip")
    live = LiveSet("me@h", Clock())
    live.state.max_workers_in_memory = 3
    burst(live, 4, 4)
    live.check()
    assert live.live == {"fake1@burst", "fake2@burst", "fake3@burst"}
    assert "fake0@burst left (offline; 3 other worker(s) live)" in lines(caplog)


def test_a_bad_heartbeat_interval_does_not_break_the_checks() -> None:
    live = LiveSet("me@h", Clock())
    live.event({**beat("w2@h"), "freq": "soon"})
    live.event({**beat("w3@h"), "freq": None})
    live.check()
    assert live.live == {"w2@h", "w3@h"}


def test_two_workers_see_each_other_and_exactly_one_wins_an_election() -> None:
    url = f"memory://{uuid.uuid4().hex}"
    app = Celeriac("g", broker=url, backend=url, worker_heartbeat_interval=0.2,
                   worker_lease_timeout=2.0)
    with ThreadedWorker(app, hostname="a@h") as a, ThreadedWorker(app, hostname="b@h") as b:
        ga, gb = a.worker.gossip, b.worker.gossip
        assert ga is not None and gb is not None
        wait_until(lambda: ga.live == {"b@h"} and gb.live == {"a@h"}, 5)
        ga.election("singleton")
        gb.election("singleton")
        wait_until(lambda: ga.election("singleton") or gb.election("singleton"), 5)
        assert ga.election("singleton") != gb.election("singleton")
        leader, other = (a, gb) if ga.election("singleton") else (b, ga)
        leader.stop()  # a warm stop resigns: the other takes over without waiting
        wait_until(lambda: other.election("singleton"), 2)
        wait_until(lambda: other.live == frozenset(), 2)  # it said worker-offline
