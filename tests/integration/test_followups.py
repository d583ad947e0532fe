"""What a task message asks for after its task (protocol v2 embed, as a Celery producer
writes it): the rest of a chain, callbacks, errbacks, run by a real prefork worker; and
what the worker refuses rather than half-run (a chord, a malformed embed)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from celeriac import Celeriac, DecodeError, serialization
from celeriac.protocol import Message, new_id, task_headers, task_properties
from celeriac.testing import WorkerProcess, wait_until

pytestmark = pytest.mark.slow


def sig(name: str, *args: Any, task_id: str | None = None, immutable: bool = False,
        **options: Any) -> dict[str, Any]:
    """A signature dict in Celery's shape."""
    return {"task": name, "args": list(args), "kwargs": {},
            "options": {"task_id": task_id or new_id(), **options},
            "subtask_type": None, "immutable": immutable, "chord_size": None}


def send(app: Celeriac, name: str, args: list[Any], embed: dict[str, Any]) -> str:
    task_id = new_id()
    _, body = serialization.dumps([args, {}, {"callbacks": None, "errbacks": None,
                                              "chain": None, "chord": None, **embed}])
    headers = task_headers(task=name, task_id=task_id, args_repr=repr(args), kwargs_repr="{}")
    app.transport.publish("celery", Message(headers, body, "application/json", "utf-8",
                                            task_properties(task_id, 0)))
    return task_id


@pytest.fixture
def worker(start_worker: Callable[..., WorkerProcess], tmp_path: Path) -> WorkerProcess:
    return start_worker("-c", "2", "-P", "prefork",
                        extra_env={"ERRBACK_FILE": str(tmp_path / "errback")})


def test_a_chain_runs_every_step_in_order_passing_results(app: Celeriac,
                                                          worker: WorkerProcess) -> None:
    last, middle = new_id(), new_id()
    # Reversed, as Celery sends it: the next step is the last element.
    first = send(app, "tests.integration.app_tasks.add", [1, 2], {"chain": [
        sig("tests.integration.app_tasks.add", 10, task_id=last),
        sig("tests.integration.app_tasks.add", 100, task_id=middle)]})
    assert app.AsyncResult(last).get(timeout=15) == 113
    assert app.AsyncResult(middle).get(timeout=1) == 103
    assert app.AsyncResult(first).get(timeout=1) == 3


def test_an_immutable_step_ignores_the_previous_result(app: Celeriac,
                                                       worker: WorkerProcess) -> None:
    last = new_id()
    send(app, "tests.integration.app_tasks.add", [1, 2], {"chain": [
        sig("tests.integration.app_tasks.add", 5, 5, task_id=last, immutable=True)]})
    assert app.AsyncResult(last).get(timeout=15) == 10


def test_callbacks_get_the_result_and_errbacks_the_failure(
        app: Celeriac, worker: WorkerProcess, tmp_path: Path) -> None:
    linked = new_id()
    send(app, "tests.integration.app_tasks.add", [2, 3], {"callbacks": [
        sig("tests.integration.app_tasks.add", 1, task_id=linked)]})
    assert app.AsyncResult(linked).get(timeout=15) == 6

    noted = new_id()
    failing = send(app, "tests.integration.app_tasks.boom", ["value"], {"errbacks": [
        sig("tests.integration.app_tasks.on_error"),
        sig("tests.integration.app_tasks.failed_id", task_id=noted)]})
    assert app.AsyncResult(noted).get(timeout=15) == failing  # old style: (task_id,)
    text = wait_until(lambda: (tmp_path / "errback").exists()
                      and (tmp_path / "errback").read_text(), 10)
    assert text == f"{failing} ValueError True"  # new style: (request, exc, traceback)


@pytest.mark.parametrize("embed, reason", [
    ({"chord": sig("tests.integration.app_tasks.add", 1)}, "chord"),
    ({"chain": {"task": "not a list"}}, "must be a list of signatures"),
    ({"callbacks": [{"no": "task"}]}, "is not a signature"),
    ({"chain": [{"task": "celery.chord", "subtask_type": "chord", "kwargs": {
        "header": []}}]}, "a chord signature without its body"),
    ({"chain": [{"task": "celery.chord", "subtask_type": "chord", "kwargs": {
        "body": sig("tests.integration.app_tasks.total")}}]},
     "a chord signature without its header"),
    ({"chain": [{"task": "celery.group", "subtask_type": "group", "kwargs": {}}]},
     "a group signature without its tasks"),
])
def test_what_the_worker_cannot_carry_out_in_full_is_refused_not_half_run(
        app: Celeriac, worker: WorkerProcess, embed: dict[str, Any], reason: str) -> None:
    task_id = send(app, "tests.integration.app_tasks.add", [1, 1], embed)
    with pytest.raises(DecodeError, match=reason):
        app.AsyncResult(task_id).get(timeout=15)
    dead = wait_until(lambda: [d for d in app.transport.dead_letters()
                               if d.message.headers["id"] == task_id], 10)
    assert reason in dead[0].reason
