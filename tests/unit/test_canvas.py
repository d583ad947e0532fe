"""Canvas: signatures, chains, groups, map/starmap/chunks, eager and on the memory broker.

A chain through a real worker needs the worker side of canvas (executing a message's
embed), built separately: here chains are checked on the wire, and a next step is sent
from an embed as a worker would send it.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

import celeriac
from celeriac import (
    AsyncResult,
    Celeriac,
    GroupResult,
    ResultTimeout,
    Signature,
    chain,
    chunks,
    group,
    signature,
    states,
)
from celeriac.canvas import chord
from celeriac.protocol import Message
from celeriac.tasks import Request
from celeriac.testing import ThreadedWorker, wait_until
from celeriac.transports.base import Outgoing


def make_app(**settings: Any) -> Celeriac:
    url = f"memory://{uuid.uuid4().hex}"
    return Celeriac(f"c{uuid.uuid4().hex[:6]}", broker=url, backend=url, **settings)


@pytest.fixture
def app() -> Iterator[Celeriac]:
    a = make_app()
    yield a
    a.close()


@pytest.fixture
def eager() -> Iterator[Celeriac]:
    a = make_app(task_always_eager=True)
    yield a
    a.close()


def tasks(app: Celeriac) -> tuple[Any, Any, Any]:
    @app.task(name="t.add")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="t.mul")
    def mul(x: int, y: int) -> int:
        return x * y

    @app.task(name="t.double")
    def double(x: int) -> int:
        return 2 * x

    return add, mul, double


def fetch_all(app: Celeriac, queue: str = "celery", limit: int = 10_000) -> list[Message]:
    async def take() -> list[Message]:
        t = app.transport
        await t.connect("probe")
        out: list[Message] = []
        while len(out) < limit:
            got = await t.fetch([queue], 1000, 0.05)
            if not got:
                break
            await t.ack(got)
            out.extend(d.message for d in got)
        return out

    return asyncio.run(take())


def body(m: Message) -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
    args, kwargs, embed = orjson.loads(m.body)
    return args, kwargs, embed


# -- signatures ----------------------------------------------------------------------------
def test_a_signature_is_celerys_dict_and_survives_json(app: Celeriac) -> None:
    add, mul, _ = tasks(app)
    sig = add.s(2, k=1).set(countdown=5)
    sig.link(mul.s(3))
    d = json.loads(json.dumps(sig))
    assert set(d) == {"task", "args", "kwargs", "options", "subtask_type", "immutable",
                      "chord_size"}
    assert (d["task"], d["args"], d["kwargs"], d["immutable"]) == ("t.add", [2], {"k": 1}, False)
    assert d["options"]["link"][0]["task"] == "t.mul"
    again = signature(d, app=app)
    assert again == sig and isinstance(again, Signature) and again.app is app
    assert again.options["link"][0] == mul.s(3)
    assert pickle.loads(pickle.dumps(sig)) == sig
    for composite in (add.s(1, 1) | mul.s(2), group(add.s(1, 1), mul.s(2, 2))):
        rebuilt = signature(json.loads(json.dumps(composite)), app=app)
        assert type(rebuilt) is type(composite) and rebuilt == composite


def test_signature_constructors(app: Celeriac) -> None:
    add, _, _ = tasks(app)
    assert add.signature((1, 2), {"z": 3}, countdown=4) == Signature(
        "t.add", (1, 2), {"z": 3}, {"countdown": 4})
    by_name = app.signature("elsewhere.task", args=(1,), queue="q")
    assert (by_name.task, by_name.args, by_name.options, by_name.app) == (
        "elsewhere.task", (1,), {"queue": "q"}, app)
    assert app.signature(dict(by_name)) == by_name
    assert add.si(1, 2).immutable and not add.s(1, 2).immutable
    with pytest.raises(celeriac.NotRegistered):
        _ = by_name.type
    assert repr(add.s(1, y=2)) == "t.add(1, y=2)" and repr(add.si(1)) == "%t.add(1)"


def test_partial_application_and_immutability(app: Celeriac) -> None:
    add, _, _ = tasks(app)
    partial = add.s(2, k=1)
    assert partial.clone(args=(1,)).args == (1, 2)
    assert partial.clone(kwargs={"j": 2}).kwargs == {"k": 1, "j": 2}
    assert partial.args == (2,) and partial.kwargs == {"k": 1}  # the original is untouched
    frozen = add.si(1, 2)
    assert frozen.clone(args=(5,), kwargs={"x": 1}).args == (1, 2)
    assert frozen.clone(args=(5,), queue="q").options == {"queue": "q"}


def test_set_clone_freeze_and_link(app: Celeriac) -> None:
    add, mul, _ = tasks(app)
    sig = add.s(1)
    assert sig.set(queue="a").set(priority=3) is sig
    assert sig.options == {"queue": "a", "priority": 3}
    copy = sig.clone(queue="b")
    copy.options["extra"] = 1
    assert sig.options == {"queue": "a", "priority": 3} and copy.options["queue"] == "b"
    assert sig.id is None
    result = sig.freeze(task_id="fixed-id")
    assert (result.id, sig.id, sig.freeze().id) == ("fixed-id", "fixed-id", "fixed-id")
    assert sig.link(mul.s(2)) == mul.s(2)
    sig.link(mul.s(2))  # already linked: not twice
    sig.link_error(add.s(0))
    assert sig.options["link"] == [mul.s(2)] and sig.options["link_error"] == [add.s(0)]


def test_on_error_chains_and_args_kwargs_options_can_be_replaced(app: Celeriac) -> None:
    # Celery's API: on_error returns the signature (link_error returns the errback), and
    # a signature's args, kwargs and options are assignable.
    add, mul, _ = tasks(app)
    sig = add.s(1)
    assert sig.on_error(mul.s(0)) is sig and sig.options["link_error"] == [mul.s(0)]
    sig.args = [5, 6]
    sig.kwargs = {"z": 1}
    sig.options = {"queue": "q"}
    assert (sig.args, sig.kwargs, sig.options) == ((5, 6), {"z": 1}, {"queue": "q"})
    assert sig["args"] == (5, 6) and signature(dict(sig), app=app).args == (5, 6)


def test_signature_sends_with_its_options_under_the_calls(app: Celeriac) -> None:
    add, mul, _ = tasks(app)
    app.task(name="t.routed", queue="special", priority=7)(lambda: None)
    r = add.s(2).set(queue="a", countdown=0).apply_async((1,), queue="b")
    [m] = fetch_all(app, "b")
    assert (m.headers["id"], body(m)[0]) == (r.id, [1, 2])
    app.signature("t.routed").delay()
    [m] = fetch_all(app, "special")  # the task's own options, as Task.apply_async
    assert m.priority == 7
    linked = add.s(1, 1)
    linked.link(mul.s(10))
    linked.delay()
    [m] = fetch_all(app)
    assert body(m)[2]["callbacks"] == [json.loads(json.dumps(mul.s(10)))]


def test_eager_signatures_and_callbacks(eager: Celeriac) -> None:
    add, _, _ = tasks(eager)
    assert add.s(2).delay(3).get() == 5
    assert add.s(2)(3) == 5  # a plain call, here
    seen: list[int] = []
    eager.task(name="t.seen")(seen.append)
    sig = add.s(2, 2)
    sig.link(eager.signature("t.seen"))
    assert sig.apply().get() == 4 and seen == [4]


# -- chains --------------------------------------------------------------------------------
def test_a_chain_sends_its_first_task_with_the_rest_reversed_in_the_embed(app: Celeriac) -> None:
    add, mul, _ = tasks(app)
    result = (add.s(1, 1) | add.s(10) | mul.s(2)).apply_async()
    [m] = fetch_all(app)  # only the first step is sent
    args, _, embed = body(m)
    second, first = result.parent, result.parent.parent
    assert first.parent is None and first.id == m.headers["id"] and args == [1, 1]
    assert [s["task"] for s in embed["chain"]] == ["t.mul", "t.add"]  # last step first
    assert [s["options"]["task_id"] for s in embed["chain"]] == [result.id, second.id]
    assert embed["chain"][1]["options"]["parent_id"] == first.id
    assert embed["chain"][0]["options"]["parent_id"] == second.id
    assert {s["options"]["root_id"] for s in embed["chain"]} == {m.headers["root_id"]} == {
        first.id}
    assert embed["callbacks"] is None and embed["chord"] is None

    # What the worker does once the first step returned 2: pop the next step and send it
    # with the previous value and the rest of the chain.
    rest = embed["chain"]
    signature(rest.pop(), app=app).apply_async((2,), chain=rest, parent_id=first.id)
    [m2] = fetch_all(app)
    args2, _, embed2 = body(m2)
    assert (m2.headers["id"], args2, m2.headers["parent_id"]) == (second.id, [2, 10], first.id)
    assert [s["options"]["task_id"] for s in embed2["chain"]] == [result.id]


def test_nested_chains_flatten_and_a_lone_step_is_just_sent(app: Celeriac) -> None:
    add, mul, _ = tasks(app)
    result = chain(add.s(1, 1), chain(add.s(2), mul.s(3))).apply_async()
    [m] = fetch_all(app)
    assert [s["task"] for s in body(m)[2]["chain"]] == ["t.mul", "t.add"]
    assert result.parent is not None and result.parent.parent is not None
    assert len((add.s(1) | (add.s(2) | mul.s(3))).tasks) == 3
    single = chain(add.s(4, 4)).apply_async()
    [m] = fetch_all(app)
    assert m.headers["id"] == single.id and body(m)[2]["chain"] is None


def test_a_chain_sent_from_a_task_takes_its_root(app: Celeriac) -> None:
    add, mul, _ = tasks(app)
    outer = Request(id="outer-1", task="parent", root_id="root-1", called_directly=False)
    app.task(name="parent")(lambda: (add.s(1, 1) | mul.s(2)).delay()).run_with(outer, (), {})
    [m] = fetch_all(app)
    assert (m.headers["parent_id"], m.headers["root_id"]) == ("outer-1", "root-1")
    assert body(m)[2]["chain"][0]["options"]["root_id"] == "root-1"


def test_chain_apply_runs_eagerly_passing_results(app: Celeriac, eager: Celeriac) -> None:
    add, mul, _ = tasks(app)
    result = (add.s(1, 1) | add.s(10) | mul.s(2)).apply()
    assert result.get() == 24 and result.parent.get() == 12 and result.parent.parent.get() == 2
    assert chain(add.si(1, 1), add.si(2, 2)).apply().get() == 4  # immutable: no passing
    assert (add.s(1) | mul.s(3)).apply((2,)).get() == 9  # partial args go to the first
    e_add, e_mul, _ = tasks(eager)
    assert (e_add.s(1, 1) | e_mul.s(5)).delay().get() == 10  # task_always_eager
    assert fetch_all(app) == []


# -- groups --------------------------------------------------------------------------------
def test_a_group_is_sent_in_bulk_one_round_trip_per_thousand(app: Celeriac) -> None:
    add, _, _ = tasks(app)
    calls: list[int] = []
    transport = app.transport
    real = transport.publish_many

    def counting(items: list[Outgoing]) -> None:
        calls.append(len(items))
        real(items)

    transport.publish_many = counting  # type: ignore[method-assign]
    result = group(add.s(i, i) for i in range(2500)).apply_async()
    assert calls == [1000, 1000, 500]
    assert isinstance(result, GroupResult) and len(result) == 2500
    messages = fetch_all(app)
    assert len(messages) == 2500
    by_id = {m.headers["id"]: m for m in messages}
    for index, r in enumerate(result):
        h = by_id[r.id].headers
        assert (h["group"], h["group_index"]) == (result.id, index)


def test_a_group_of_chains_sends_each_member_as_a_chain(app: Celeriac) -> None:
    add, mul, _ = tasks(app)
    result = group(add.s(1, 1) | mul.s(2), add.s(3, 3)).apply_async((), queue="g")
    first, plain = fetch_all(app, "g")
    last_step = body(first)[2]["chain"][0]
    assert last_step["options"]["task_id"] == result.results[0].id
    assert (last_step["options"]["group_id"], last_step["options"]["group_index"]) == (
        result.id, 0)
    assert first.headers["group"] is None  # the group waits for the chain's last step
    assert (plain.headers["group"], plain.headers["group_index"]) == (result.id, 1)
    assert result.results[1].id == plain.headers["id"]


def test_group_apply_and_partial_args(eager: Celeriac) -> None:
    add, mul, _ = tasks(eager)
    assert group(add.s(i, i) for i in range(3)).apply().get() == [0, 2, 4]
    assert group(add.s(1), add.s(2)).apply_async((10,)).get() == [11, 12]
    assert group([add.s(1, 1), group(mul.s(2, 2), mul.s(3, 3))]).delay().get() == [2, 4, 9]
    assert group(add.s(1, 1) | mul.s(3), add.si(0, 0)).apply().join() == [6, 0]


# -- GroupResult ---------------------------------------------------------------------------
def test_group_result_reads_in_batches(app: Celeriac) -> None:
    backend = app.backend
    results = [app.AsyncResult(f"id-{i}") for i in range(1200)]
    gr = GroupResult("g-1", results, app)
    reads: list[int] = []
    real = backend._get

    def counting(ids: Any) -> Any:
        reads.append(len(ids))
        return real(ids)

    backend._get = counting  # type: ignore[method-assign]
    assert gr.completed_count() == 0
    assert reads == [500, 500, 200]
    assert gr.waiting() and not gr.ready()
    for i, r in enumerate(results):
        backend.store(r.id, states.SUCCESS, i)
    reads.clear()
    assert gr.get(timeout=5) == list(range(1200))
    assert len(reads) <= 3  # one read per batch of ids, not one per task
    assert gr.completed_count() == 1200 and gr.ready() and gr.successful()
    assert not gr.failed() and gr.join(timeout=1) == list(range(1200))


def test_group_result_failures_timeouts_and_revoke(app: Celeriac) -> None:
    backend = app.backend
    a, b, c = (app.AsyncResult(i) for i in ("a", "b", "c"))
    gr = GroupResult("g-2", [a, b, c], app)
    backend.store("a", states.SUCCESS, 1)
    backend.store("b", states.FAILURE, ValueError("bad"))
    with pytest.raises(ResultTimeout, match="1 of 3"):
        gr.get(timeout=0.05)
    backend.store("c", states.SUCCESS, 3)
    with pytest.raises(ValueError, match="bad"):
        gr.get(timeout=1)
    values = gr.get(timeout=1, propagate=False)
    assert values[0] == 1 and isinstance(values[1], ValueError) and values[2] == 3
    assert gr.failed() and not gr.successful() and gr.completed_count() == 2
    assert list(gr) == [a, b, c] and gr[1] == b and gr.children == [a, b, c]
    sent: list[tuple[Any, ...]] = []
    app.control.revoke = lambda ids, **kw: sent.append((ids, kw))  # type: ignore[method-assign]
    gr.revoke(terminate=True)
    assert sent == [(["a", "b", "c"], {"terminate": True, "signal": "SIGTERM",
                                        "reply": False, "timeout": 1.0})]


def test_group_result_save_and_restore(app: Celeriac) -> None:
    add, _, _ = tasks(app)
    gr = group(add.s(i, i) for i in range(3)).apply_async()
    assert gr.save() is gr
    restored = GroupResult.restore(gr.id, app=app)
    assert restored == gr and [r.id for r in restored] == [r.id for r in gr]
    assert app.AsyncResult(gr.id).state == states.PENDING  # the group id is no task's
    for i, r in enumerate(gr):
        app.backend.store(r.id, states.SUCCESS, 2 * i)
    assert restored.get(timeout=1) == [0, 2, 4]
    gr.delete()
    assert GroupResult.restore(gr.id, app=app) is None
    assert GroupResult.restore("never-saved", app=app) is None


# -- map, starmap, chunks ------------------------------------------------------------------
def test_builtins_are_registered_on_every_app(app: Celeriac) -> None:
    add, _, double = tasks(app)
    assert {"celery.map", "celery.starmap"} <= set(make_app().tasks)
    # As a worker runs them: the member task arrives as a signature dict.
    assert app.tasks["celery.starmap"](json.loads(json.dumps(add.s())), [[1, 2]]) == [3]
    assert app.tasks["celery.map"](dict(double.s()), [1, 2]) == [2, 4]


def test_map_starmap_and_chunks_eager(eager: Celeriac) -> None:
    add, _, double = tasks(eager)
    assert double.map([1, 2, 3]).delay().get() == [2, 4, 6]
    assert add.starmap([(1, 2), (3, 4)]).apply().get() == [3, 7]
    pairs = list(zip(range(10), range(10), strict=True))
    assert add.chunks(pairs, 3).apply().get() == [[0, 2, 4], [6, 8, 10], [12, 14, 16], [18]]
    assert chunks(add.s(), pairs, 5).delay().get() == [[0, 2, 4, 6, 8], [10, 12, 14, 16, 18]]
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        add.chunks(pairs, 0)


def test_map_and_chunks_on_the_wire(app: Celeriac) -> None:
    add, _, _ = tasks(app)
    routed = app.task(name="t.routed", queue="special")(lambda x: x)
    routed.map([1, 2]).delay()
    [m] = fetch_all(app, "special")  # routed as its member task
    assert m.headers["task"] == "celery.map"
    assert body(m)[1] == {"task": json.loads(json.dumps(routed.s())), "it": [1, 2]}
    result = add.chunks([(i, i) for i in range(5)], 2).apply_async()
    messages = fetch_all(app)
    assert [m.headers["task"] for m in messages] == ["celery.starmap"] * 3
    assert [body(m)[1]["it"] for m in messages] == [[[0, 0], [1, 1]], [[2, 2], [3, 3]],
                                                    [[4, 4]]]
    assert {m.headers["group"] for m in messages} == {result.id}


# -- chords ------------------------------------------------------------------------------
def test_a_chord_sends_its_header_with_the_body_in_each_embed(app: Celeriac,
                                                               eager: Celeriac) -> None:
    add, mul, _ = tasks(app)
    result = chord([add.s(1, 1), add.s(2, 2)], mul.s(2)).apply_async()
    messages = fetch_all(app)
    assert [m.headers["task"] for m in messages] == [add.name, add.name]
    group_id = messages[0].headers["group"]
    assert [m.headers["group_index"] for m in messages] == [0, 1]
    for m in messages:
        carried = body(m)[2]["chord"]
        assert (carried["task"], carried["chord_size"]) == (mul.name, 2)
        assert carried["options"]["task_id"] == result.id
    assert isinstance(result.parent, GroupResult) and result.parent.id == group_id
    saved = GroupResult.restore(group_id, app=app)  # what the completing worker reads
    assert saved is not None and [r.id for r in saved.results] == [
        m.headers["id"] for m in messages]
    assert isinstance(group(add.s(1, 1)) | mul.s(2), chord)
    # A group after a group: a chord whose body is the second group (Celery's upgrade).
    steps = chain(add.s(1, 1), group(add.s(1), add.s(2)), group(mul.s(2), mul.s(3)),
                  add.s(3))._steps(None, None)
    assert [type(s) for s in steps] == [Signature, chord]
    assert isinstance(steps[1].body, chord) and isinstance(steps[1].body.header, group)
    assert steps[1].body.body.task == add.name
    with pytest.raises(TypeError, match="cannot link a group"):
        group(add.s(1, 1)).apply_async(link=mul.s(2))
    e_add, e_mul, _ = tasks(eager)
    assert chord([e_add.s(1, 1), e_add.s(2, 2)], e_mul.s(2)).apply().get() == [2, 4, 2, 4]


def test_frozen_ids_are_the_ids_sent(app: Celeriac) -> None:
    add, mul, _ = tasks(app)
    c = add.s(1, 1) | mul.s(2)
    frozen = c.freeze()
    sent = c.apply_async()
    assert (sent.id, sent.parent.id) == (frozen.id, frozen.parent.id)
    g = group(add.s(1, 1), group(add.s(2, 2), add.s(3, 3)))
    frozen_group = g.freeze()
    assert len(frozen_group) == 3
    assert g.apply_async() == frozen_group
    messages = fetch_all(app)
    assert {m.headers["id"] for m in messages} == {
        frozen.parent.id, *(r.id for r in frozen_group)}


def test_canvas_messages_have_send_tasks_headers(app: Celeriac) -> None:
    add, mul, _ = tasks(app)
    add.s(1, 1).delay()  # through send_task
    (add.s(1, 1) | mul.s(2)).delay()  # through the canvas path (an embed)
    plain, chained = fetch_all(app)
    assert set(plain.headers) == set(chained.headers)
    assert plain.properties.keys() == chained.properties.keys()
    assert body(plain)[2] == {"callbacks": None, "errbacks": None, "chain": None,
                              "chord": None}


def test_signatures_of_shared_tasks(eager: Celeriac) -> None:
    from celeriac.runtime import state as _state

    def triple(x: int) -> int:
        return 3 * x

    proxy = celeriac.shared_task(name="t.shared_triple")(triple)
    try:
        eager.set_current()
        assert signature(proxy, (2,)).delay().get() == 6
        assert proxy.s(3).apply().get() == 9
        assert chunks(proxy, [(1,), (2,)], 1).apply().get() == [[3], [6]]
    finally:  # shared tasks join every app made later: not other tests' apps
        _state._shared[:] = [(fn, o) for fn, o in _state._shared if fn is not triple]


# -- nesting ---------------------------------------------------------------------------------
def test_a_group_then_a_step_in_a_chain_travels_as_a_chord_step(app: Celeriac) -> None:
    add, mul, double = tasks(app)
    result = chain(add.s(1, 1), group(add.s(10), add.s(20)), mul.s(3), double.s()).apply_async()
    [first] = fetch_all(app)
    assert first.headers["task"] == add.name
    steps = body(first)[2]["chain"]  # Celery's order: last step first
    assert [s["subtask_type"] for s in steps] == [None, "chord"]
    step = steps[1]
    assert [t["task"] for t in step["kwargs"]["header"]["kwargs"]["tasks"]] == [add.name] * 2
    chord_body = step["kwargs"]["body"]
    assert chord_body["task"] == mul.name
    # The chain's last result is double's, whose parent is the chord's body.
    assert result.id == steps[0]["options"]["task_id"]
    assert result.parent is not None and result.parent.id == chord_body["options"]["task_id"]
    group_id = step["kwargs"]["header"]["options"]["task_id"]
    assert isinstance(result.parent.parent, GroupResult)
    assert result.parent.parent.id == group_id


def test_a_chord_first_in_a_chain_carries_the_rest_on_its_body(app: Celeriac) -> None:
    add, mul, double = tasks(app)
    result = (group(add.s(1, 1), add.s(2, 2)) | mul.s(2) | double.s()).apply_async()
    messages = fetch_all(app)
    assert [m.headers["task"] for m in messages] == [add.name, add.name]
    carried = body(messages[0])[2]["chord"]
    assert carried["task"] == mul.name
    [rest] = carried["options"]["chain"]
    assert (rest["task"], rest["options"]["task_id"]) == (double.name, result.id)


def test_chains_in_a_chord_header_carry_the_chord_on_their_last_step(app: Celeriac) -> None:
    add, mul, double = tasks(app)
    result = chord([add.s(1, 1) | double.s(), add.s(2, 2) | double.s()], mul.s(1)).apply_async()
    messages = fetch_all(app)
    assert [m.headers["task"] for m in messages] == [add.name, add.name]
    for m in messages:
        _, _, embed = body(m)
        assert "chord" not in embed or not embed["chord"]  # the first step is not counted
        [last] = embed["chain"]
        assert last["task"] == double.name
        assert last["options"]["chord"]["options"]["task_id"] == result.id
        assert m.headers["group"] is None  # the first step is no member of the chord
        assert last["options"]["group_id"] == result.parent.id
    saved = GroupResult.restore(result.parent.id, app=app)
    assert saved is not None
    # The chord waits for each chain's last step.
    assert [r.id for r in saved.results] == [
        body(m)[2]["chain"][0]["options"]["task_id"] for m in messages]


def test_nested_canvases_run_eagerly(eager: Celeriac) -> None:
    add, mul, double = tasks(eager)
    assert chain(add.s(1, 1), group(add.s(10), add.s(20)), mul.s(3)).apply().get() == [
        12, 22, 12, 22, 12, 22]
    assert (group(add.s(1, 1), add.s(2, 2)) | mul.s(2) | double.s()).apply().get() == [
        2, 4, 2, 4, 2, 4, 2, 4]
    assert chord([add.s(1, 1) | double.s(), add.s(2, 2) | double.s()],
                 mul.s(1)).apply().get() == [4, 8]


def test_result_tuples_round_trip(app: Celeriac) -> None:
    from celeriac.result import AsyncResult, result_from_tuple

    child = AsyncResult("c1", app)
    child.parent = AsyncResult("p1", app)
    grp = GroupResult("g1", [AsyncResult("m1", app), AsyncResult("m2", app)], app)
    wire = json.loads(json.dumps([child.as_tuple(), grp.as_tuple()]))
    assert wire[0] == [["c1", [["p1", None], None]], None]  # Celery's shape
    back = [result_from_tuple(t, app) for t in wire]
    assert back[0].id == "c1" and back[0].parent is not None and back[0].parent.id == "p1"
    assert isinstance(back[1], GroupResult) and [r.id for r in back[1]] == ["m1", "m2"]


def test_a_chord_s_chained_body_keeps_its_steps_as_parents(app: Celeriac) -> None:
    # Celery links res.parent of a chord's chain body to the chain's previous step, and
    # the header's GroupResult above the chain's first step.
    add, mul, _ = tasks(app)
    res = chord([add.s(1, 1), add.s(2, 2)], add.s(10) | mul.s(3)).apply_async()
    assert res.parent is not None and res.parent.parent is not None
    assert isinstance(res.parent, AsyncResult) and not isinstance(res.parent, GroupResult)
    assert isinstance(res.parent.parent, GroupResult) and len(res.parent.parent.results) == 2
    plain_body = chord([add.s(1, 1)], add.s(10)).apply_async()
    assert isinstance(plain_body.parent, GroupResult)


def test_a_generator_header_is_published_member_by_member(app: Celeriac) -> None:
    add, _, _ = tasks(app)
    queued = []

    def header() -> Iterator[Signature]:
        for i in range(3):
            queued.append(app.transport.queue_length("celery"))
            yield add.s(i, i)

    res = chord(header(), add.s(0)).apply_async()
    # Each member was in the queue before the generator made the next, and the
    # celery.chord_unlock that waits for all three is behind them (it looks at once).
    assert queued == [0, 1, 2] and app.transport.queue_length("celery") == 4
    assert [m.headers["task"] for m in fetch_all(app)][-1] == "celery.chord_unlock"
    assert isinstance(res.parent, GroupResult) and len(res.parent.results) == 3
    unread = chord((add.s(i, i) for i in range(2)), add.s(0))
    assert len(unread.header.tasks) == 2  # any other use reads it whole


def test_chord_unlock_looks_again_soon_then_less_often(monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    # Behind a generator's header it looks at once; then 10 ms, doubling up to
    # result_chord_retry_interval, where Celery waits that long every time.
    app = make_app(result_chord_retry_interval=0.08)
    release = threading.Event()

    @app.task(name="t.held")
    def held() -> int:
        release.wait(10)
        return 1

    @app.task(name="t.total")
    def total(values: list[int]) -> int:
        return sum(values)

    unlock = app.tasks["celery.chord_unlock"]
    waits: list[float] = []
    real_retry = unlock.retry

    def retry(*args: Any, **kwargs: Any) -> Any:
        waits.append(kwargs["countdown"])
        return real_retry(*args, **kwargs)

    monkeypatch.setattr(unlock, "retry", retry)
    try:
        with ThreadedWorker(app, pool="threads", concurrency=2):
            res = chord((held.s() for _ in range(1)), total.s()).apply_async()
            wait_until(lambda: len(waits) >= 6, 10, message="the unlock's looks")
            release.set()
            assert res.get(timeout=10) == 1
    finally:
        release.set()
        app.close()
    assert waits[:6] == [0.01, 0.02, 0.04, 0.08, 0.08, 0.08]


# -- stamping (Celery's StampingVisitor) -----------------------------------------------------
class _Stamp(celeriac.canvas.StampingVisitor):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def on_signature(self, sig: Signature, **headers: Any) -> dict[str, Any]:
        self.calls.append(f"sig:{sig.task}")
        return {"stamp": 42}

    def on_group_start(self, group: Any, **headers: Any) -> dict[str, Any]:
        self.calls.append("group")
        return {}

    def on_chain_start(self, chain: Any, **headers: Any) -> dict[str, Any]:
        self.calls.append("chain")
        return {}

    def on_chord_body(self, sig: Any, **headers: Any) -> dict[str, Any]:
        self.calls.append("body")
        return {"in_body": True}

    def on_callback(self, callback: Signature, **header: Any) -> dict[str, Any]:
        return {"link": "cb"}


def test_stamping_visits_every_signature_of_a_canvas(app: Celeriac) -> None:
    add, mul, _ = tasks(app)
    with pytest.raises(TypeError):
        celeriac.canvas.StampingVisitor()  # type: ignore[abstract]  # on_signature needed
    sig = add.si(1, 1)
    sig.link(mul.s(2))
    visitor = _Stamp()
    sig.stamp(visitor)
    assert sig.options["stamped_headers"] == ["stamp"] and sig.options["stamp"] == 42
    link = sig.options["link"][0]
    assert link.options["link"] == "cb" and link.options["stamp"] == 42
    assert set(link.options["stamped_headers"]) == {"link", "stamp"}
    canvas = chord([add.s(1, 1) | add.s(2), group(mul.s(2, 2))], add.s(5))
    visitor = _Stamp()
    canvas.stamp(visitor)
    assert visitor.calls[:3] == ["group", "chain", "sig:t.add"] and "body" in visitor.calls
    steps = canvas.tasks[0].tasks
    assert all(s.options["stamp"] == 42 for s in (*steps, canvas.tasks[1].tasks[0]))
    assert canvas.body.options["in_body"] is True and canvas.body.options["stamp"] == 42
    # Stamps given as keywords, appended when asked: a stamp given twice becomes a list.
    plain_sig = add.s(1, 1)
    plain_sig.stamp(monitoring="a")
    plain_sig.stamp(monitoring="b", append_stamps=True)
    assert plain_sig.options["monitoring"] == ["b", "a"]
    # A stamp is kept against a call's options of the same name.
    assert plain_sig._merge((), {}, {"monitoring": "c", "queue": "q"})[2]["monitoring"] \
        == ["b", "a"]


def test_stamps_travel_as_celerys_headers(app: Celeriac) -> None:
    add, mul, _ = tasks(app)
    sig = add.si(1, 1)
    sig.link(mul.s(2))
    sig.stamp(_Stamp())
    sig.apply_async()
    (message,) = fetch_all(app)
    assert message.headers["stamped_headers"] == ["stamp"]
    assert message.headers["stamps"] == {"stamp": 42}
    callback = body(message)[2]["callbacks"][0]  # a follow-up carries its own stamps
    assert callback["options"]["stamp"] == 42
    c = add.s(1, 1) | mul.s(2)
    c.stamp(_Stamp())
    c.apply_async()
    (first,) = fetch_all(app)
    assert first.headers["stamps"] == {"stamp": 42}
    assert body(first)[2]["chain"][0]["options"]["stamped_headers"] == ["stamp"]


# -- nested signature dicts ------------------------------------------------------------------
def test_nested_canvases_rebuild_from_their_dicts(app: Celeriac) -> None:
    add, _, _ = tasks(app)
    shapes = [chain(chain([add.s()])), chain(group([add.s()])),
              chain(chord([add.s()], add.s())), group(chain([add.s()])),
              group(group([add.s()])), group(chord([add.s()], add.s())),
              chord(chain([add.s()]), add.s()), chord(group([add.s()]), add.s()),
              chord(chord([add.s()], add.s()), add.s())]

    def walk(sig: Any) -> None:
        assert isinstance(sig, Signature), sig
        if isinstance(sig, (chain, group, chord)):
            for member in sig.tasks:
                walk(member)
        if isinstance(sig, chord):
            walk(sig.body)

    for shape in shapes:
        walk(Signature.from_dict(json.loads(json.dumps(shape)), app=app))
    # One signature as a chord's header is a header of one; a task given bare is its call.
    assert chord(add.si(42), add.s()).tasks == [add.si(42)]
    assert chord([add, add], add.s()).tasks == [add.s(), add.s()]


def test_nesting_shapes_celery_supports(app: Celeriac) -> None:
    add, mul, _ = tasks(app)
    # A group of one in a chain is its member (Celery's unrolling).
    assert [s.task for s in chain(group(add.s(0, 0)), add.s(-1))._steps(None, None)] == [
        add.name, add.name]
    # A chain ending in a group, in a chord's header: its results as one list, counted
    # once (a chord of its own whose body passes the list on).
    steps, _ = chain(add.s(1, 1), group(add.s(1), add.s(2)))._freeze_steps(
        None, None, {"group_id": "g", "chord": {"task": "t.mul"}})
    assert isinstance(steps[-1], chord) and steps[-1].body.task == "celery.accumulate"
    assert steps[-1].options["group_id"] == "g"
    # A chord in a chord's header: its body takes the member's place in the outer chord.
    outer = chord([chord([add.s(1, 1), add.s(2, 2)], mul.s(2)), add.s(3, 3)], add.s(0))
    result = outer.apply_async()
    messages = fetch_all(app)
    inner_body = [m for m in messages if body(m)[2]["chord"]["task"] == mul.name]
    assert len(inner_body) == 2  # the inner header's two tasks carry the inner body
    carried = body(inner_body[0])[2]["chord"]
    assert carried["options"]["group_id"] == result.parent.id
    assert carried["options"]["chord"]["task"] == add.name
    assert carried["options"]["task_id"] == result.parent.results[0].id


def test_celery_chord_is_a_builtin_that_applies_a_chord(app: Celeriac) -> None:
    add, mul, _ = tasks(app)
    assert "celery.chord" in app.tasks
    body_id = app.tasks["celery.chord"](
        json.loads(json.dumps(group(add.s(1, 1), add.s(2, 2)))),
        json.loads(json.dumps(mul.s(2))))
    messages = fetch_all(app)
    assert len(messages) == 2
    assert {body(m)[2]["chord"]["options"]["task_id"] for m in messages} == {body_id}


def test_a_group_links_its_first_member_and_a_frozen_chain_has_its_last_tasks_id(
        app: Celeriac) -> None:
    add, mul, _ = tasks(app)
    g = group(add.s(1, 1), add.s(2, 2))
    g.link(mul.s(2))  # Celery's: once, on the first member, immutable
    g.link_error(mul.si(0, 0))  # Celery's: on every member
    assert [len(m.options.get("link") or ()) for m in g.tasks] == [1, 0]
    assert g.tasks[0].options["link"][0].immutable
    assert [len(m.options["link_error"]) for m in g.tasks] == [1, 1]
    last = mul.s(2).set(task_id="42")
    c = add.s(4) | last
    assert c.id is None
    c.freeze(last.id)
    assert c.id == "42"
