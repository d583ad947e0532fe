"""Canvas through a real prefork worker: chains pass results along, groups come back in
order, links and errbacks run, map/starmap/chunks run as one task per chunk.

The module's tests share one worker (and the modules that import them, one per broker or
backend): a worker start per test was most of their time. None of them stops, reconfigures
or counts the log of its worker, and each waits for its own task ids."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from celeriac import Celeriac, ChordError, GroupResult, Signature, chain, chord, chunks, group
from celeriac.testing import WorkerProcess, wait_until
from tests.integration import app_tasks as t

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def env(module_env: dict[str, str]) -> dict[str, str]:
    return module_env  # the shared worker's broker: one for the module


@pytest.fixture(scope="module")
def shared_worker(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[WorkerProcess]:
    """The module's prefork worker, on its ``env``; ``worker`` hands it to each test."""
    home = tmp_path_factory.mktemp("worker")
    w = WorkerProcess("tests.integration.app_tasks", "-c", "2", "-P", "prefork",
                      env={**env, "ERRBACK_FILE": str(home / "errback")}, cwd=str(home))
    try:
        yield w.start()
    finally:
        w.kill()


@pytest.fixture
def worker(shared_worker: WorkerProcess, tmp_path: Path) -> WorkerProcess:
    """The shared worker, checked alive (a worker that died fails the next test here, not
    by its timeouts); its new-style errback writes to this test's ``tmp_path / "errback"``
    (its ``ERRBACK_FILE`` is a link pointed here for each test, as a worker of the test's
    own would have it)."""
    w = shared_worker
    assert w.proc is not None
    if w.proc.poll() is not None:
        pytest.fail(f"the module's worker exited ({w.proc.returncode}) before this test; "
                    f"its log:\n{w.log[-5000:]}", pytrace=False)
    link = Path(w.env["ERRBACK_FILE"])
    link.unlink(missing_ok=True)
    link.symlink_to(tmp_path / "errback")
    return w


def test_a_chain_passes_each_result_on_and_links_its_results(
        app: Celeriac, worker: WorkerProcess) -> None:
    elsewhere = Celeriac("elsewhere", broker="memory://elsewhere")  # now the current app
    r = (t.add.s(1, 2) | t.add.s(10) | t.add.s(100)).apply_async()  # still sent by t.app
    assert r.get(timeout=15) == 113
    assert r.parent is not None and r.parent.get(timeout=5) == 13
    assert r.parent.parent is not None and r.parent.parent.get(timeout=5) == 3
    assert chain(t.add.si(1, 1), t.add.si(2, 2)).apply_async().get(timeout=15) == 4
    assert group(t.add.s(1, 1)).apply_async().get(timeout=15) == [2]
    elsewhere.close()


def test_a_group_returns_results_in_member_order(app: Celeriac, worker: WorkerProcess
                                                 ) -> None:
    g = group(t.add.s(i, i) for i in range(50)).apply_async()
    assert isinstance(g, GroupResult)
    assert g.get(timeout=20) == [2 * i for i in range(50)]
    assert g.completed_count() == 50 and g.successful()
    g.save()
    again = GroupResult.restore(g.id, app=app)
    assert again is not None and again.get(timeout=5) == g.get(timeout=5)


def test_a_group_of_chains(app: Celeriac, worker: WorkerProcess) -> None:
    g = group(t.add.s(i, 1) | t.add.s(10) for i in range(5)).apply_async()
    assert g.get(timeout=20) == [i + 11 for i in range(5)]


def test_link_and_link_error(app: Celeriac, worker: WorkerProcess) -> None:
    linked = t.add.s(100)
    linked.freeze()
    assert t.add.apply_async((1, 2), link=linked).get(timeout=15) == 3
    assert app.AsyncResult(linked.id).get(timeout=15) == 103
    noted = t.failed_id.s()
    noted.freeze()
    failing = t.boom.apply_async(("value",), link_error=noted)
    assert app.AsyncResult(noted.id).get(timeout=15) == failing.id


def test_map_starmap_and_chunks(app: Celeriac, worker: WorkerProcess) -> None:
    assert t.total.map([[1, 2], [3, 4]]).apply_async().get(timeout=15) == [3, 7]
    assert t.add.starmap([(1, 2), (3, 4)]).apply_async().get(timeout=15) == [3, 7]
    parts = chunks(t.add, [(i, i) for i in range(10)], 3).apply_async()
    assert parts.get(timeout=15) == [[0, 2, 4], [6, 8, 10], [12, 14, 16], [18]]


def test_progress_is_a_custom_state_readable_while_the_task_runs(
        app: Celeriac, worker: WorkerProcess, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    r = t.progress.delay(str(gate))
    wait_until(lambda: r.state == "PROGRESS", 10, message="PROGRESS stored")
    assert r.info == {"done": 1, "total": 2} and not r.ready()
    gate.touch()
    assert r.get(timeout=15) == "finished" and r.state == "SUCCESS"


def test_a_chord_runs_its_body_once_with_the_header_results_in_order(
        app: Celeriac, worker: WorkerProcess) -> None:
    r = chord(t.add.s(i, i) for i in range(20))(t.total.s())
    assert r.get(timeout=20) == sum(2 * i for i in range(20))
    assert isinstance(r.parent, GroupResult)
    assert r.parent.get(timeout=5) == [2 * i for i in range(20)]
    assert (group(t.add.s(i, 1) for i in range(3)) | t.total.s()).apply_async().get(
        timeout=20) == 6
    assert chord([], t.total.s()).apply_async().get(timeout=20) == 0


def test_a_generator_header_is_sent_as_it_is_read(app: Celeriac, worker: WorkerProcess
                                                  ) -> None:
    # Celery's #3021: a header slow to make starts running before it is all made.
    seen = []

    def header() -> Iterator[Signature]:
        first = t.add.s(1, 1)
        first.freeze()
        yield first
        seen.append(app.AsyncResult(first.id).get(timeout=15))  # ran: it was sent at once
        yield t.add.s(2, 2)

    r = chord(header(), t.total.s()).apply_async()
    assert r.get(timeout=20) == 6 and seen == [2]
    assert isinstance(r.parent, GroupResult) and r.parent.get(timeout=5) == [2, 4]


def test_a_failed_header_task_fails_the_chord_naming_it_and_the_body_does_not_run(
        app: Celeriac, worker: WorkerProcess) -> None:
    failing = t.boom.s("value")
    failing.freeze()
    noted = t.failed_id.s()
    noted.freeze()
    body = t.total.s()
    body.link_error(noted)
    r = chord([t.add.s(1, 1), failing], body).apply_async()
    with pytest.raises(ValueError, match="bad value"):  # the header task's own (Celery's)
        r.get(timeout=20)
    with pytest.raises(ChordError, match=f"Dependency {failing.id} raised FAILURE: "
                                         r"ValueError\(bad value\)"):
        r.get(timeout=20, follow_parents=False)  # what is stored for the body
    assert app.AsyncResult(noted.id).get(timeout=15) == r.id  # link_error ran, once


# -- nesting ---------------------------------------------------------------------------------
def test_a_group_then_a_step_in_a_chain_is_a_chord(app: Celeriac, worker: WorkerProcess
                                                   ) -> None:
    r = chain(t.add.s(1, 1), group(t.add.s(10), t.add.s(20)), t.total.s(),
              t.add.s(1)).apply_async()
    assert r.get(timeout=20) == 35
    assert r.parent is not None and r.parent.get(timeout=5) == 34
    header = r.parent.parent
    assert isinstance(header, GroupResult) and header.get(timeout=5) == [12, 22]


def test_a_chord_in_a_chain_with_chains_in_its_header(app: Celeriac, worker: WorkerProcess
                                                      ) -> None:
    workflow = (t.add.s(1, 1)
                | chord([t.add.s(1) | t.add.s(10), t.add.s(2) | t.add.s(20)], t.total.s())
                | t.add.s(100))
    # add(1, 1) = 2; the header chains: (2 + 1) + 10 and (2 + 2) + 20; total 37; + 100.
    assert workflow.apply_async().get(timeout=20) == 137


def test_a_failed_step_fails_the_rest_of_its_chain(app: Celeriac, worker: WorkerProcess
                                                   ) -> None:
    r = (t.add.s(1, 1) | t.boom.si("value") | t.add.s(1) | t.add.s(2)).apply_async()
    with pytest.raises(ValueError, match="bad value"):
        r.get(timeout=15)  # stored for the steps that never ran: nobody waits forever
    assert r.parent is not None and r.parent.failed()


def test_a_chain_failing_in_a_chord_header_fails_the_chord(app: Celeriac,
                                                           worker: WorkerProcess) -> None:
    inner = t.add.s(1)
    r = chord([t.add.s(1, 1) | t.boom.si("value") | inner, t.add.s(2, 2)],
              t.total.s()).apply_async()
    with pytest.raises(ValueError, match="bad value"):
        r.get(timeout=20)
    with pytest.raises(ChordError, match=r"raised FAILURE: ValueError\(bad value\)"):
        r.get(timeout=20, follow_parents=False)


def test_children_and_collect_walk_what_a_task_sent(app: Celeriac, worker: WorkerProcess
                                                    ) -> None:
    r = t.spawn.delay(3)
    assert r.get(timeout=15) == 3
    children = r.children
    assert [c.get(timeout=15) for c in children] == [0, 2, 4]
    assert [value for _, value in r.collect(timeout=15)] == [3, 0, 2, 4]
    c = (t.add.s(1, 1) | t.add.s(2)).apply_async()
    assert c.get(timeout=15) == 4
    # The first step's result (and its children) is stored after it sent the next step,
    # which may finish first: wait for it.
    assert c.parent is not None and c.parent.get(timeout=15) == 2
    assert c.parent.children == [c]  # the chain's next step


def test_nesting_celery_supports(app: Celeriac, worker: WorkerProcess) -> None:
    # A chord as a group member and in a chord's header: its body takes the place.
    assert group(chord([t.add.s(1, 1), t.add.s(2, 2)], t.total.s()),
                 t.add.s(5, 5)).apply_async().get(timeout=20) == [6, 10]
    assert chord([chord([t.add.s(1, 1), t.add.s(2, 2)], t.total.s()), t.add.s(3, 3)],
                 t.total.s()).apply_async().get(timeout=20) == 12
    # A chain ending in a group as a group member: the group's results as one list.
    assert group(t.add.si(1, 1), chain(t.add.si(5, 5), group(t.add.s(1), t.add.s(2)))
                 ).apply_async().get(timeout=20) == [2, [11, 12]]
    # A chain ending in a chord in a chord's header; a group after a group in a chain.
    inner = chain(t.add.si(1, 1), chord([t.add.s(1), t.add.s(2)], t.total.s()))
    assert chord([inner, t.add.si(0, 1)], t.total.s()).apply_async().get(timeout=20) == 8
    grouped = chain(t.add.si(1, 1), group(t.add.s(1), t.add.s(2)),
                    group(t.total.s(), t.total.s()), t.total.s())
    assert grouped.apply_async().get(timeout=20) == 14
