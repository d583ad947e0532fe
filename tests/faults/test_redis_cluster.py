"""The Redis transport and result backend on a real Redis Cluster (three masters on
loopback ports, started by this module): the transport and backend contract suites, run
against ``redis+cluster://``, and a real worker draining 1,000 tasks.

Each contract test gets its own namespace, so its queues hash to slots of their own.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from celeriac import Celeriac, Settings
from celeriac.testing import WorkerProcess
from celeriac.transports.base import create_transport
from tests.contracts import test_backend_chord_contract as backend_chord_contract
from tests.contracts import test_backend_contract as backend_contract
from tests.contracts import test_transport_contract as transport_contract
from tests.contracts.conftest import BackendFactory, TransportFactory
from tests.faults.redis_sets import Cluster, cluster, free_ports
from tests.integration import app_tasks as t
from tests.loops import run

pytestmark = pytest.mark.slow

# What a Cluster cannot keep, with the reason (shown in the report).
NOT_ON_CLUSTER = {
    "test_priority_applies_across_queues":
        "each queue has its own slot: priority orders within a queue (as on RabbitMQ)",
}


def _cases(module: object, fixture: str) -> list[Callable[..., None]]:
    return [f for name, f in sorted(vars(module).items())
            if name.startswith("test_") and callable(f)
            and list(inspect.signature(f).parameters) == [fixture]]


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with cluster(tmp_path_factory.mktemp("cluster")) as c:
        yield c


@pytest.mark.parametrize("case", _cases(transport_contract, "transport"),
                         ids=lambda f: f.__name__)
def test_transport_contract(case: Callable[[TransportFactory], None],
                            redis_cluster: Cluster) -> None:
    if case.__name__ in NOT_ON_CLUSTER:
        pytest.skip(NOT_ON_CLUSTER[case.__name__])
    factory = TransportFactory("redis+cluster", redis_cluster.url(f"t{uuid.uuid4().hex[:8]}"))
    try:
        case(factory)
    finally:
        factory.close_all()


@pytest.mark.parametrize("case", _cases(backend_contract, "backend")
                         + _cases(backend_chord_contract, "chords"),
                         ids=lambda f: f.__name__)
def test_backend_contract(case: Callable[[BackendFactory], None],
                          redis_cluster: Cluster) -> None:
    factory = BackendFactory("redis+cluster", redis_cluster.url(f"b{uuid.uuid4().hex[:8]}"))
    try:
        case(factory)
    finally:
        factory.close_all()


def test_a_worker_drains_1000_tasks(app: Celeriac, env: dict[str, str], redis_cluster: Cluster,
                                    start_worker: Callable[..., WorkerProcess],
                                    tmp_path: Path) -> None:
    ns = f"w{uuid.uuid4().hex[:8]}"
    env.update(CELERIAC_BROKER_URL=redis_cluster.url(ns),
               CELERIAC_RESULT_BACKEND=redis_cluster.url(ns + "r"))
    app.close()
    app.settings = Settings.from_env(env)
    results = t.add.delay_many([(i, i) for i in range(1000)])
    worker = start_worker("-c", "2")
    done = app.backend.wait_for([r.id for r in results], timeout=60)
    assert len(done) == 1000, f"{1000 - len(done)} missing; worker log:\n{worker.log[-3000:]}"
    assert all(done[r.id].result == 2 * i for i, r in enumerate(results))
    assert app.transport.queue_length("celery") == 0


def test_broadcasts_reach_a_subscriber_through_any_node_that_answers(
        redis_cluster: Cluster) -> None:
    # The URL's first node is down (nothing listens there): subscriptions go through
    # the next node, and a broadcast (sent through the cluster client) reaches them.
    dead = free_ports(1)[0]
    url = redis_cluster.url(f"p{uuid.uuid4().hex[:8]}").replace(
        "redis+cluster://", f"redis+cluster://127.0.0.1:{dead};")
    transport = create_transport(url, Settings(broker_url=url))

    async def scenario() -> bytes | None:
        sub = await transport.subscribe("news")
        try:
            transport.broadcast("news", b"hello")
            return await sub.get(5.0)
        finally:
            await sub.close()

    try:
        assert run(scenario()) == b"hello"
    finally:
        transport.close()
