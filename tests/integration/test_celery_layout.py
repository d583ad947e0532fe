"""The Celery project of ``examples/celery_layout``, run as its users run it: a real
``celeriac -A proj worker -Q celery,billing -c 2`` in the example's directory, with the
broker URL from the environment, and every task sent through the project's own app.

The project is imported in this process too (as a Django process imports it); its
modules, its shared tasks and the current app are put back as they were afterwards.
"""

from __future__ import annotations

import importlib
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import redis

from celeriac import Celeriac, current_app
from celeriac.runtime import state as celeriac_state
from celeriac.testing import WorkerProcess, wait_until
from tests.services import require

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parent.parent.parent
EXAMPLE = ROOT / "examples" / "celery_layout"


@pytest.fixture(scope="module")
def ns() -> Iterator[str]:
    """A namespace of this module's own on the shared Redis; its keys deleted after."""
    require("redis")
    name = f"cl{uuid.uuid4().hex[:12]}"
    yield name
    admin = redis.Redis()
    keys = list(admin.scan_iter(match=f"{name}*", count=1000))
    if keys:
        admin.delete(*keys)
    admin.close()


@pytest.fixture(scope="module")
def project_env(ns: str) -> dict[str, str]:
    """The environment the project's settings.py reads."""
    url = f"{require('redis')}?namespace={ns}"
    return {"CELERY_BROKER_URL": url, "CELERY_RESULT_BACKEND": url,
            "BILLING_AUDIT_URL": require("redis"), "BILLING_AUDIT_PREFIX": f"{ns}:audit"}


def _project_modules() -> dict[str, ModuleType]:
    return {name: m for name, m in sys.modules.items()
            if name == "proj" or name.startswith("proj.")}


@pytest.fixture(scope="module")
def project(project_env: dict[str, str]) -> Iterator[ModuleType]:
    """``import proj`` with the test's environment; undone after."""
    previous_app = celeriac_state._current
    shadowed = _project_modules()  # another test's "proj", if any
    for name in shadowed:
        del sys.modules[name]
    with pytest.MonkeyPatch.context() as mp:
        for key, value in project_env.items():
            mp.setenv(key, value)
        mp.syspath_prepend(str(EXAMPLE))
        proj = importlib.import_module("proj")
        app: Celeriac = proj.celery_app
        app.finalize()  # what a worker does at start: imports the autodiscovered modules
        yield proj
        app.close()
        ours = {m.__name__ for m in _project_modules().values()}
        for name in ours:
            del sys.modules[name]
        sys.modules.update(shadowed)
        # shared_task registers with every app made later: not with other tests' apps.
        celeriac_state._shared[:] = [(fn, opts) for fn, opts in celeriac_state._shared
                                     if fn.__module__ not in ours]
        for other in list(celeriac_state._apps):
            if other is not app:
                for name in [n for n, task in other.tasks.items()
                             if task.fn.__module__ in ours]:
                    del other.tasks[name]
        celeriac_state._current = previous_app


@pytest.fixture
def app(project: ModuleType) -> Celeriac:
    """The project's app, current (``@shared_task`` proxies resolve to it)."""
    app: Celeriac = project.celery_app
    app.set_current()
    return app


@pytest.fixture(scope="module")
def worker(project: ModuleType, project_env: dict[str, str]) -> Iterator[WorkerProcess]:
    w = WorkerProcess("proj", "-Q", "celery,billing", "-c", "2", env=project_env,
                      cwd=str(EXAMPLE))
    w.start(ready_timeout=20)
    yield w
    w.kill()


@pytest.fixture
def audit() -> Iterator[redis.Redis]:
    client = redis.Redis(decode_responses=True)
    yield client
    client.close()


def test_settings_come_from_the_namespaced_module(app: Celeriac, project: ModuleType,
                                                  project_env: dict[str, str]) -> None:
    assert celeriac_state.get_current_app() is app and current_app.main == "proj"
    assert app is project.celery.app
    conf = app.conf
    assert conf.broker_url == project_env["CELERY_BROKER_URL"]
    assert conf.result_backend == project_env["CELERY_RESULT_BACKEND"]
    assert conf.accept_content == ("json",)
    assert conf.worker_prefetch_multiplier == 1  # "1" in settings.py
    assert conf.result_extended is True
    # Django's own settings are not Celery's: ignored under the CELERY namespace.
    assert project.settings.DEBUG is False and project.settings.SECRET_KEY
    for name in ("debug", "secret_key", "installed_apps", "billing_audit_url"):
        assert not hasattr(app.settings, name)
    assert app.route("proj.billing.tasks.charge") == "billing"
    assert app.route("proj.orders.tasks.add") == "celery"
    assert set(app.tasks) >= {
        "proj.celery.debug_task", "proj.orders.tasks.add", "proj.orders.tasks.place_order",
        "proj.orders.tasks.send_confirmation", "proj.orders.tasks.slow",
        "proj.billing.tasks.charge"}
    assert app.tasks["proj.orders.tasks.slow"].options.rate_limit == "50/s"
    assert app.tasks["proj.orders.tasks.add"].options.rate_limit is None


def test_shared_task_with_extended_result(app: Celeriac, worker: WorkerProcess) -> None:
    from proj.orders import tasks as orders

    r = orders.add.delay(2, 3)
    assert r.get(timeout=10) == 5
    stored = app.AsyncResult(r.id)  # knows only the id: the rest is result_extended's
    assert stored.name == "proj.orders.tasks.add"
    assert stored.args == [2, 3] and stored.kwargs == {}
    assert stored.queue == "celery"
    assert stored.worker and "@" in stored.worker


def test_task_calling_a_task_sets_its_parent_id(app: Celeriac, worker: WorkerProcess) -> None:
    from proj.orders import tasks as orders

    items = [{"qty": 2, "price": 150}, {"qty": 1, "price": 99}]
    r = orders.place_order.delay("A-1", "ann@example.com", items)
    placed = r.get(timeout=10)
    assert placed["order_id"] == "A-1" and placed["total"] == 399
    confirmation = app.AsyncResult(placed["confirmation_id"])
    receipt = confirmation.get(timeout=10)
    # The bound task read its own id, and the id of the task that sent it.
    assert receipt == {"order_id": "A-1", "email": "ann@example.com",
                       "task_id": placed["confirmation_id"], "parent_id": r.id}
    assert confirmation.name == "proj.orders.tasks.send_confirmation"
    assert confirmation.args == ["A-1", "ann@example.com"]
    assert app.AsyncResult(r.id).args == ["A-1", "ann@example.com", items]


def test_billing_goes_to_its_queue_and_its_base_class_audits(
        app: Celeriac, worker: WorkerProcess, audit: redis.Redis, ns: str) -> None:
    from proj.billing import tasks as billing

    assert "queues celery,billing" in worker.log
    ok = billing.charge.delay("cust-1", 500)
    assert ok.get(timeout=10) == {"customer_id": "cust-1", "charged": 500}
    assert app.AsyncResult(ok.id).queue == "billing"  # routed by CELERY_TASK_ROUTES
    assert app.AsyncResult(ok.id).name == "proj.billing.tasks.charge"
    assert isinstance(app.tasks["proj.billing.tasks.charge"], billing.AuditedTask)

    def audit_line(task_id: str) -> dict[bytes | str, bytes | str]:
        return wait_until(lambda: audit.hgetall(f"{ns}:audit:{task_id}"), 10,
                          message=f"the audit line of {task_id}")

    line = audit_line(ok.id)  # written by on_success, after the result is stored
    assert line == {"task": "proj.billing.tasks.charge", "status": "ok",
                    "result": '{"customer_id": "cust-1", "charged": 500}'}

    declined = billing.charge.delay("cust-2", 0)
    with pytest.raises(billing.PaymentDeclined, match="invalid amount 0 for cust-2"):
        declined.get(timeout=10)
    assert app.AsyncResult(declined.id).queue == "billing"
    line = audit_line(declined.id)  # written by on_failure
    assert line == {"task": "proj.billing.tasks.charge", "status": "failed",
                    "error": "PaymentDeclined('invalid amount 0 for cust-2')"}


def test_annotated_task_runs_under_its_rate_limit(app: Celeriac, worker: WorkerProcess
                                                  ) -> None:
    from proj.orders import tasks as orders

    results = [orders.slow.delay(i) for i in range(10)]
    assert [r.get(timeout=10) for r in results] == [2 * i for i in range(10)]
    # 50/s from CELERY_TASK_ANNOTATIONS: ten calls take about 9 x 20 ms in the worker.
    done = sorted(r.date_done for r in results if r.date_done is not None)
    assert len(done) == 10
    assert (done[-1] - done[0]).total_seconds() >= 0.12


def test_app_task_in_the_celery_module(app: Celeriac, worker: WorkerProcess) -> None:
    from proj.celery import debug_task

    r = debug_task.delay()
    worker.wait_for_log(rf"proj\.celery\.debug_task\[{r.id}\] succeeded")
    assert "Request: Request(id=" in worker.log

