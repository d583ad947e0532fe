"""Celery's ``task_allow_error_cb_on_chord_header``: where a chord's errback is linked,
on the signatures and through a worker in a thread of this process (memory transport)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from celeriac import Celeriac, ChordError, chain, chord, group
from celeriac.testing import wait_until


def errbacks(sig: Any) -> list[Any]:
    return list(sig.options.get("link_error") or [])


@pytest.fixture
def t(celeriac_app: Celeriac) -> Iterator[SimpleNamespace]:
    app = celeriac_app
    seen: list[str] = []
    lock = threading.Lock()

    @app.task(name="eb.identity")
    def identity(x: Any) -> Any:
        return x

    @app.task(name="eb.fail")
    def fail() -> None:
        raise ValueError("expected")

    @app.task(name="eb.record")
    def record(word: str) -> str:
        with lock:
            seen.append(word)
        return word

    yield SimpleNamespace(app=app, identity=identity, fail=fail, record=record, seen=seen)
    app.conf.task_allow_error_cb_on_chord_header = False


def test_flag_off_links_the_errback_to_the_chord_only(t: SimpleNamespace) -> None:
    c = chord([t.identity.si(1), t.fail.si()], t.record.si("body"))
    eb = t.record.si("errback")
    c.link_error(eb)
    assert errbacks(c) == [eb]
    assert all(not errbacks(task) for task in c.tasks)


def test_flag_on_links_an_immutable_copy_to_every_header_task(t: SimpleNamespace) -> None:
    t.app.conf.task_allow_error_cb_on_chord_header = True
    c = chord([t.identity.s(1), t.fail.si()], t.record.si("body"))
    eb = t.record.s()
    c.link_error(eb)
    assert errbacks(c) == [eb]
    for task in c.tasks:
        (linked,) = errbacks(task)
        assert linked.immutable and linked.task == "eb.record"
    assert not eb.immutable  # the chord's own (for the body) is the one given


def test_a_chord_in_the_header_links_it_for_its_body_either_way(t: SimpleNamespace) -> None:
    inner = chord([t.identity.si(1), t.fail.si()], t.identity.si("inner body"))
    outer = chord(group([t.identity.si(3), inner]), t.record.si("body"))
    eb = t.record.si("errback")
    outer.link_error(eb)
    assert errbacks(inner) == [eb]  # Celery's edge case: the nested chord links it
    assert all(not errbacks(task) for task in inner.tasks)  # flag off: not its header


def test_a_generator_header_is_linked_as_it_is_read(t: SimpleNamespace) -> None:
    t.app.conf.task_allow_error_cb_on_chord_header = True
    read: list[int] = []

    def members() -> Iterator[Any]:
        for i in range(3):
            read.append(i)
            yield t.identity.si(i)

    c = chord(members(), t.record.si("body"))
    c.link_error(t.record.si("errback"))
    assert read == []  # linking does not read the stream
    assert [len(errbacks(task)) for task in c.tasks] == [1, 1, 1]


def test_flag_on_end_to_end_one_errback_per_failed_header_task_and_the_body(
        t: SimpleNamespace, celeriac_worker: Any) -> None:
    t.app.conf.task_allow_error_cb_on_chord_header = True
    c = chord([t.fail.si(), t.identity.si(42), t.fail.si()], t.record.si("body"))
    c.link_error(t.record.si("errback"))
    res = c.delay()
    with pytest.raises(ValueError, match="expected"):  # the header task's own
        res.get(timeout=20)
    wait_until(lambda: len(t.seen) >= 3, timeout=20)
    assert sorted(t.seen) == ["errback"] * 3 and "body" not in t.seen


def test_flag_on_upgraded_chord_in_a_chain(t: SimpleNamespace, celeriac_worker: Any) -> None:
    t.app.conf.task_allow_error_cb_on_chord_header = True
    workflow = chain(group([t.fail.si(), t.identity.si(42)]), t.record.si("body"))
    workflow.link_error(t.record.si("errback"))
    res = workflow.delay()
    with pytest.raises((ValueError, ChordError)):
        res.get(timeout=20)
    wait_until(lambda: len(t.seen) >= 2, timeout=20)
    assert sorted(t.seen) == ["errback"] * 2  # the failed header task's and the body's


def test_flag_off_end_to_end_only_the_body_errback(t: SimpleNamespace,
                                                  celeriac_worker: Any) -> None:
    c = chord([t.fail.si(), t.fail.si()], t.record.si("body"))
    c.link_error(t.record.si("errback"))
    with pytest.raises(ValueError):
        c.delay().get(timeout=20)
    wait_until(lambda: len(t.seen) >= 1, timeout=20)
    assert t.seen == ["errback"]


def test_the_callers_signatures_are_not_linked(t: SimpleNamespace) -> None:
    """Celery copies a chord's header signatures: its suite counts the failing ones by
    comparing them with fresh ``fail.si()`` after linking, and by ``sig.name``."""
    t.app.conf.task_allow_error_cb_on_chord_header = True
    header = (t.fail.si(), t.identity.si(42), t.fail.si())
    c = chord(header, t.record.si("body"))
    c.link_error(t.record.si("errback"))
    assert [sig == t.fail.si() for sig in header] == [True, False, True]
    assert [sig.name for sig in header] == ["eb.fail", "eb.identity", "eb.fail"]
    assert all(errbacks(task) for task in c.tasks)
