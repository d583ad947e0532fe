"""Remote control on the memory transport: the wire format, signing, the registry's
checks, and real workers (in threads) answering, filtering and refusing commands."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from celeriac import Celeriac, states
from celeriac.control import merge
from celeriac.control.mailbox import (
    CONTROL_CHANNEL,
    Verifier,
    decode_command,
    encode_command,
    sign,
)
from celeriac.control.registry import convert
from celeriac.control.registry import load as load_commands
from celeriac.errors import ConfigurationError, ControlError, TaskRevoked
from celeriac.settings import Settings
from celeriac.testing import ThreadedWorker, wait_until
from celeriac.worker.revoked import Revoked, load_statedb, save_statedb


# -- the wire ---------------------------------------------------------------------------
def test_command_has_pidbox_shape_and_round_trips() -> None:
    raw = encode_command("rate_limit", {"task_name": "a", "rate_limit": "1/s"},
                         destination=["w1@h"], ticket="t1", reply=True)
    body = orjson.loads(raw)
    assert body["method"] == "rate_limit" and body["ticket"] == "t1"
    assert body["reply_to"] == {"exchange": "celeriac.reply", "routing_key": "t1"}
    assert body["destination"] == ["w1@h"] and "signature" not in body
    cmd = decode_command(raw)
    assert cmd.arguments == {"task_name": "a", "rate_limit": "1/s"}
    assert cmd.reply_channel == "celeriac.reply.t1"
    assert decode_command(encode_command("ping")).reply_channel is None


@pytest.mark.parametrize(("payload", "problem"), [
    (b"{not json", "not JSON"),
    (b"[]", "JSON object"),
    (b'{"arguments": {}}', "no 'method'"),
    (b'{"method": "ping", "arguments": []}', "'arguments'"),
    (b'{"method": "ping", "destination": "w1"}', "'destination'"),
    (b'{"method": "ping", "ticket": "../x"}', "'ticket'"),
    (b'{"method": "ping", "reply_to": {"routing_key": "a b"}}', "routing_key"),
])
def test_malformed_commands_are_named(payload: bytes, problem: str) -> None:
    with pytest.raises(ControlError, match=problem):
        decode_command(payload)


def test_signing_refuses_unsigned_bad_stale_and_replayed() -> None:
    v = Verifier("k", max_age=30)
    now = time.time()
    good = decode_command(encode_command("ping", ticket="a", signing_key="k", now=now))
    v.check(good, now)
    with pytest.raises(ControlError, match="replay"):
        v.check(good, now + 1)
    with pytest.raises(ControlError, match="not signed"):
        v.check(decode_command(encode_command("ping", ticket="b", now=now)), now)
    with pytest.raises(ControlError, match="bad signature"):
        v.check(decode_command(encode_command("ping", ticket="c", signing_key="other",
                                              now=now)), now)
    with pytest.raises(ControlError, match="older than control_max_age"):
        v.check(decode_command(encode_command("ping", ticket="d", signing_key="k",
                                              now=now - 31)), now)
    # Any field changed after signing breaks the signature (here: the destination).
    body = orjson.loads(encode_command("shutdown", ticket="e", signing_key="k", now=now))
    body["destination"] = ["victim@h"]
    with pytest.raises(ControlError, match="bad signature"):
        v.check(decode_command(orjson.dumps(body)), now)
    assert body["signature"] != sign("k", body)


def test_registry_checks_and_converts_arguments() -> None:
    commands = load_commands()
    for name in ("ping", "active", "reserved", "scheduled", "revoked", "registered", "stats",
                 "active_queues", "conf", "query_task", "report", "revoke", "rate_limit",
                 "time_limit", "pool_grow", "pool_shrink", "autoscale", "add_consumer",
                 "cancel_consumer", "enable_events", "disable_events", "heartbeat",
                 "shutdown", "hello"):
        assert name in commands, name
    assert commands["ping"].read_only and not commands["revoke"].read_only
    rate = commands["rate_limit"]
    assert convert(rate, ["proj.add", "10/m"]) == {"task_name": "proj.add",
                                                   "rate_limit": "10/m"}
    with pytest.raises(ControlError, match="missing argument 'rate_limit'"):
        rate.check({"task_name": "x"})
    with pytest.raises(ControlError, match="unknown argument 'rate'"):
        rate.check({"task_name": "x", "rate": 1})
    grow = commands["pool_grow"]
    assert convert(grow, ["3"]) == {"n": 3}
    with pytest.raises(ControlError, match="'n' must be int, got 'x'"):
        convert(grow, ["x"])
    with pytest.raises(ControlError, match="'n' must be int, got bool"):
        grow.check({"n": True})
    with pytest.raises(ControlError, match="too many arguments"):
        convert(grow, ["1", "2"])
    assert convert(commands["query_task"], ["a", "b"]) == {"ids": ["a", "b"]}


def test_settings_for_remote_control() -> None:
    assert Settings(worker_remote_control="read-only").worker_remote_control == "read-only"
    assert Settings(worker_remote_control="false").worker_remote_control is False
    assert Settings.from_env({"CELERIAC_WORKER_REMOTE_CONTROL": "read-only"}
                             ).worker_remote_control == "read-only"
    with pytest.raises(ConfigurationError, match="worker_remote_control"):
        Settings(worker_remote_control="sometimes")
    # Celery's names: worker_enable_remote_control converts, worker_state_db is ours too.
    s = Settings().replace(worker_enable_remote_control=False, worker_state_db="x.state")
    assert s.worker_remote_control is False and s.worker_state_db == "x.state"


# -- the revoked set ------------------------------------------------------------------------
def test_revoked_is_bounded_and_expires(tmp_path: Path) -> None:
    r = Revoked(maxlen=3, expires=100)
    for i in range(5):
        r.add(f"id{i}")
    assert list(r.ids) == ["id2", "id3", "id4"]
    assert not r.add("old", time.time() - 1)
    r.update({"peer": time.time() + 0.05, "bad": "x"})  # type: ignore[dict-item]
    assert "peer" in r and "bad" not in r
    time.sleep(0.06)  # sleep-ok: let the 50 ms revoke expire
    r.purge()
    assert "peer" not in r and len(r) == 2
    path = str(tmp_path / "w.state")
    save_statedb(path, r, clock=7)
    data = load_statedb(path)
    assert data["clock"] == 7 and set(data["revoked"]) == set(r.ids)
    assert load_statedb(str(tmp_path / "missing")) == {}


# -- real workers on the memory broker ------------------------------------------------------
def _app(url: str, **settings: Any) -> Celeriac:
    settings.setdefault("result_backend", url)
    app = Celeriac("ctl", broker=url, set_as_current=False, **settings)

    @app.task(name="ctl.add")
    def add(x: int, y: int) -> int:
        return x + y

    return app


@pytest.fixture
def url() -> str:
    return f"memory://{uuid.uuid4().hex}"


@pytest.fixture
def two(url: str) -> Iterator[tuple[Celeriac, ThreadedWorker, ThreadedWorker]]:
    apps = [_app(url) for _ in range(3)]
    w1 = ThreadedWorker(apps[0], hostname="w1@h").start()
    w2 = ThreadedWorker(apps[1], hostname="w2@h").start()
    yield apps[2], w1, w2
    for w in (w1, w2):
        w.stop()
    for app in apps:
        app.close()


def test_ping_destination_limit_and_errors(two: tuple[Celeriac, ThreadedWorker,
                                                      ThreadedWorker]) -> None:
    app, _, _ = two
    replies = merge(app.control.ping(timeout=2, limit=2))
    assert replies == {"w1@h": {"ok": "pong"}, "w2@h": {"ok": "pong"}}
    # A destination makes limit its length: the call returns as soon as it answered.
    start = time.monotonic()
    assert app.control.ping(destination=["w2@h"], timeout=5) == [{"w2@h": {"ok": "pong"}}]
    assert time.monotonic() - start < 1
    assert app.control.inspect(pattern="w1*", limit=1).ping() == {"w1@h": {"ok": "pong"}}
    got = merge(app.control.broadcast("nope", reply=True, destination=["w1@h"]))
    assert got == {"w1@h": {"error": "unknown command 'nope'"}}
    got = merge(app.control.broadcast("pool_grow", {"n": "many"}, reply=True,
                                      destination=["w1@h"]))
    assert got == {"w1@h": {"error": "pool_grow: argument 'n' must be int, got str"}}
    got = merge(app.control.broadcast("rate_limit", {"task_name": "nope", "rate_limit": 1},
                                      reply=True, destination=["w1@h"]))
    assert got == {"w1@h": {"error": "rate_limit: unknown task 'nope'"}}
    # Still alive after all that, and the broker holds no reply channel.
    assert len(app.control.ping(timeout=2, limit=2)) == 2
    broker = app.transport.broker  # type: ignore[attr-defined]
    # The workers' own subscriptions stay (control, and Gossip's events); no reply channel.
    assert set(broker.subscribers) - {"celeriac.events"} == {CONTROL_CHANNEL}


def test_inspect_commands_answer(two: tuple[Celeriac, ThreadedWorker, ThreadedWorker]
                                 ) -> None:
    app, w1, _ = two
    i = app.control.inspect(destination=["w1@h"], timeout=2)
    assert i.registered() == {"w1@h": ["ctl.add"]}
    assert i.active() == {"w1@h": []} and i.reserved() == {"w1@h": []}
    assert i.scheduled() == {"w1@h": []} and i.revoked() == {"w1@h": []}
    stats = i.stats()["w1@h"]  # type: ignore[index]
    assert stats["pool"]["max-concurrency"] == 1 and stats["broker"]["transport"] == "memory"
    assert stats["prefetch_count"] == 4 and "utime" in stats["rusage"]
    assert i.active_queues()["w1@h"][0]["name"] == "celery"  # type: ignore[index]
    assert "ok" in i.report()["w1@h"]  # type: ignore[index]
    assert i.query_task("unknown") == {"w1@h": {}}
    assert app.control.rate_limit("ctl.add", "10/m", reply=True, destination=["w1@h"]) == [
        {"w1@h": {"ok": "new rate limit set successfully"}}]
    assert w1.worker.consumer.limiter.limits["ctl.add"] is not None
    assert app.control.time_limit("ctl.add", soft=1, hard=2, reply=True,
                                  destination="w1@h") == [
        {"w1@h": {"ok": "time limits set successfully"}}]


def test_conf_masks_secrets(url: str) -> None:
    app = _app(url, control_signing_key="s3cret", result_backend="memory://:pw@results")
    with ThreadedWorker(app, hostname="w@h"):
        conf = app.control.inspect(limit=1, timeout=2).conf()["w@h"]  # type: ignore[index]
    app.close()
    assert conf["control_signing_key"] == "********"
    assert conf["result_backend"] == "memory://:***@results"
    assert "s3cret" not in orjson.dumps(conf).decode()


def test_revoke_before_start_is_acked_unrun_and_remembered(url: str) -> None:
    app = _app(url)
    add = app.tasks["ctl.add"]
    with ThreadedWorker(app, hostname="w@h") as w:
        r = add.apply_async((1, 2), countdown=0.3)
        assert app.control.revoke(r.id, reply=True, limit=1) == [
            {"w@h": {"ok": f"tasks {r.id} flagged as revoked"}}]
        with pytest.raises(TaskRevoked, match="revoked"):
            r.get(timeout=5)
        assert r.state == states.REVOKED
        assert add.delay(2, 2).get(timeout=5) == 4
        assert w.worker.processed == 1  # the revoked one never ran
    # The broker's store has it: a worker started now honours it without the broadcast.
    r2 = add.apply_async((3, 3), countdown=0.2)
    app.control.record_revoked([r2.id])
    with ThreadedWorker(_app(url), hostname="late@h") as late:
        assert r2.id in late.worker.revoked
        with pytest.raises(TaskRevoked):
            r2.get(timeout=5)
    app.close()


def test_signed_and_read_only_workers(url: str, caplog: pytest.LogCaptureFixture) -> None:
    signed = _app(url, control_signing_key="k")
    ro = _app(url, worker_remote_control="read-only")
    with ThreadedWorker(signed, hostname="s@h"), ThreadedWorker(ro, hostname="ro@h"):
        caller = _app(url)
        with caplog.at_level(logging.WARNING, "celeriac.worker.control"):
            got = merge(caller.control.ping(timeout=2, limit=2))
        assert got is not None
        assert got["ro@h"] == {"ok": "pong"}
        assert "not signed" in got["s@h"]["error"]
        assert [r.getMessage() for r in caplog.records if "not signed" in r.getMessage()]
        got = merge(caller.control.rate_limit("ctl.add", 5, reply=True,
                                              destination=["ro@h"]))
        assert got is not None and "read-only" in got["ro@h"]["error"]
        keyed = _app(url, control_signing_key="k")
        assert keyed.control.ping(destination=["s@h"], timeout=2) == [
            {"s@h": {"ok": "pong"}}]
        for a in (caller, keyed):
            a.close()
    for a in (signed, ro):
        a.close()


def test_remote_control_off_and_mingle(url: str) -> None:
    off = _app(url, worker_remote_control=False)
    first = _app(url)
    with ThreadedWorker(off, hostname="off@h"), ThreadedWorker(first, hostname="a@h") as a:
        a.worker.revoked.add("known-to-a")
        with ThreadedWorker(_app(url), hostname="b@h") as b:
            # Mingle asked a@h (the one listener) at b's start and merged its set.
            assert "known-to-a" in b.worker.revoked
        assert merge(first.control.ping(timeout=0.3)) == {"a@h": {"ok": "pong"}}
    first.close()
    off.close()


def test_worker_stays_up_when_a_handler_fails(url: str, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    app = _app(url)
    with ThreadedWorker(app, hostname="w@h"):
        commands = load_commands()
        spec = commands["clock"]

        def boom(state: Any) -> None:
            raise RuntimeError("broken handler")

        monkeypatch.setitem(commands, "clock", spec.__class__(
            spec.name, boom, spec.kind, spec.args, spec.required, True, spec.help))
        got = app.control.inspect(limit=1, timeout=2).clock()
        assert got == {"w@h": {"error": "clock failed: RuntimeError: broken handler"}}
        wait_until(lambda: app.control.ping(limit=1, timeout=1), 5)
    app.close()


def test_signal_names_and_table_rendering() -> None:
    import signal

    from celeriac.cli.control import render
    from celeriac.worker.control import signal_number

    assert signal_number("SIGKILL") == signal_number("kill") == signal_number(9) == 9
    assert signal_number("15") == signal.SIGTERM
    with pytest.raises(ControlError, match="unknown signal 'SIGNOPE'"):
        signal_number("SIGNOPE")
    assert render({"ok": "pong"}) == "OK: pong"
    assert render({"error": "bad"}) == "ERROR: bad"
    assert render([]) == "- empty -"
    assert render([{"id": "i", "name": "n", "args": "(1,)", "kwargs": "{}"}]) == \
        "n[i] args=(1,) kwargs={}"
    assert render({"a": 1, "b": [2]}) == "a: 1\nb: [2]"
