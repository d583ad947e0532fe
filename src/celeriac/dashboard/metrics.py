"""``/metrics``: the cluster as the dashboard sees it, in Prometheus' text format.

A custom collector reads the monitor at scrape time instead of keeping live metric
objects in step with every event; it is registered in the dashboard's own
``CollectorRegistry`` so that several apps (tests, embedding) never collide in the
global one.

Families (``name`` is the task name):

- ``celeriac_tasks{state,name}``: tasks in the dashboard's memory, by current state.
- ``celeriac_tasks_finished_total{name,state}``: task events that end a run
  (SUCCESS, FAILURE, RETRY, REJECTED, REVOKED) since the dashboard started.
- ``celeriac_task_runtime_seconds{name}``: histogram of reported runtimes.
- ``celeriac_queue_length{queue}``: ready messages (absent for a queue that cannot be read).
- ``celeriac_worker_up{hostname}``, ``celeriac_workers_online``,
  ``celeriac_worker_active_tasks{hostname}``, ``celeriac_worker_processed_total{hostname}``.
- ``celeriac_events_received_total``, ``celeriac_events_receiver_connected``,
  ``celeriac_dashboard_stream_clients``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

if TYPE_CHECKING:
    from .monitor import Monitor


class ClusterCollector:
    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor

    def collect(self) -> Iterator[Metric]:
        m = self.monitor
        state = m.state

        by_state: Counter[tuple[str, str]] = Counter(
            (str(t.state), str(t.name or "unknown")) for t in state.tasks.values())
        tasks = GaugeMetricFamily("celeriac_tasks", "Tasks in the dashboard's memory by state "
                                  "and task name.", labels=["state", "name"])
        for (task_state, name), count in sorted(by_state.items()):
            tasks.add_metric([task_state, name], count)
        yield tasks

        finished = CounterMetricFamily("celeriac_tasks_finished", "Task events that end a run, "
                                       "by task name and state.", labels=["name", "state"])
        for (name, task_state), count in sorted(m.finished.items()):
            finished.add_metric([name, task_state], count)
        yield finished

        runtime = HistogramMetricFamily("celeriac_task_runtime_seconds",
                                        "Task runtimes reported by workers.", labels=["name"])
        for name, buckets, total in m.runtimes.cumulative():
            runtime.add_metric([name], buckets, total)
        yield runtime

        queues = GaugeMetricFamily("celeriac_queue_length", "Messages ready in a queue.",
                                   labels=["queue"])
        for name in m.queue_names():
            length = m.queue_lengths.get(name)
            if length is not None:
                queues.add_metric([name], length)
        yield queues

        up = GaugeMetricFamily("celeriac_worker_up", "1 while a worker sends heartbeats.",
                               labels=["hostname"])
        active = GaugeMetricFamily("celeriac_worker_active_tasks",
                                   "Tasks a worker is running.", labels=["hostname"])
        processed = CounterMetricFamily("celeriac_worker_processed",
                                        "Tasks a worker has processed since it started.",
                                        labels=["hostname"])
        online = 0
        for hostname, worker in sorted(state.workers.items()):
            alive = bool(worker.alive)
            online += alive
            up.add_metric([hostname], 1 if alive else 0)
            active.add_metric([hostname], worker.active or 0)
            processed.add_metric([hostname], worker.processed or 0)
        yield up
        yield active
        yield processed
        yield GaugeMetricFamily("celeriac_workers_online", "Workers sending heartbeats.",
                                value=online)

        yield CounterMetricFamily("celeriac_events_received", "Events the dashboard received.",
                                  value=m.events_received)
        yield GaugeMetricFamily("celeriac_events_receiver_connected",
                                "1 while the dashboard is subscribed to events.",
                                value=1 if m.connected else 0)
        yield GaugeMetricFamily("celeriac_dashboard_stream_clients",
                                "Browsers connected to the live event stream.",
                                value=len(m.hub.clients))


def registry_for(monitor: Monitor) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector(monitor))
    return registry
