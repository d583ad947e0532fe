"""Flow control's task options where a task is declared and sent (``producer/flow.py``), on
the memory broker and store: bad values refused naming the option; a unique task sent
twice sends one message; its lock released when the publish fails; the keys' headers."""

from __future__ import annotations

from typing import Any

import pytest

from celeriac import Celeriac
from celeriac.errors import ConfigurationError
from celeriac.producer.flow import CONCURRENCY_HEADER, FAIR_HEADER, UNIQUE_HEADER, lock_name


@pytest.mark.parametrize(("options", "match"), [
    ({"unique_for": 0}, "unique_for must be a number of seconds > 0"),
    ({"unique_for": True}, "unique_for must be"),
    ({"unique_for": 5, "unique_mode": "sometimes"}, "unique_mode must be one of"),
    ({"concurrency": 0}, "concurrency must be an int >= 1"),
    ({"concurrency": 2.5}, "concurrency must be an int >= 1"),
    ({"concurrency_key": lambda a, k: 1}, "concurrency_key needs concurrency="),
    ({"unique_for": 5, "unique_key": "tenant"}, "unique_key must be callable"),
])
def test_bad_flow_options_are_refused_naming_the_option(
        memory_app: Celeriac, options: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        memory_app.task(name="flow.bad", **options)(lambda: None)


def test_a_unique_task_sent_twice_sends_one_message(memory_app: Celeriac) -> None:
    @memory_app.task(name="flow.once", unique_for=30)
    def once(x: int) -> int:
        return x

    first, again, other = once.delay(1), once.delay(1), once.delay(2)
    assert again.id == first.id != other.id
    assert memory_app.transport.queue_length("celery") == 2


def test_a_failed_publish_releases_the_lock(memory_app: Celeriac,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    @memory_app.task(name="flow.fragile", unique_for=30)
    def fragile() -> None:
        return None

    def down(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("broker down")

    with monkeypatch.context() as m:
        m.setattr(memory_app.publisher, "publish", down)
        with pytest.raises(ConnectionError):
            fragile.delay()
    sent = fragile.delay()  # not refused by a lock nothing holds
    assert memory_app.transport.queue_length("celery") == 1 and sent.id


def test_headers_carry_the_lock_the_concurrency_key_and_the_fair_key(
        memory_app: Celeriac) -> None:
    memory_app.conf.update(broker_fair_queues=("fair",))
    seen: list[dict[str, Any]] = []

    class Spy:
        def before_publish(self, message: Any, queue: str) -> None:
            seen.append(dict(message.headers))

    from celeriac.hooks import Hooks

    memory_app.add_hooks(type("SpyHooks", (Hooks,), {"before_publish": Spy.before_publish})())

    @memory_app.task(name="flow.tenant", unique_for=30, concurrency=2,
                     concurrency_key=lambda a, k: k["tenant"])
    def tenant_task(*, tenant: str) -> str:
        return tenant

    tenant_task.apply_async(kwargs={"tenant": "t1"}, queue="fair", fair_key="t1")
    (headers,) = seen
    assert headers[UNIQUE_HEADER] == [lock_name("flow.tenant", (), {"tenant": "t1"}, None),
                                      "until_finished"]
    assert headers[CONCURRENCY_HEADER] == "t1" and headers[FAIR_HEADER] == "t1"


def test_long_keys_are_hashed_in_the_lock_name() -> None:
    name = lock_name("t", ("x" * 500,), {}, None)
    assert name.startswith("unique:t:") and len(name) == len("unique:t:") + 64
    assert lock_name("t", (), {}, lambda a, k: "mine") == "unique:t:mine"


def test_without_a_shared_store_a_unique_send_names_the_task() -> None:
    app = Celeriac("nostore", broker="amqp://guest@127.0.0.1:1//", backend="rpc://")
    try:
        @app.task(name="flow.nostore", unique_for=30)
        def nostore() -> None:
            return None

        with pytest.raises(ConfigurationError, match=r"task 'flow\.nostore': unique_for "
                                                     "needs a store every process shares"):
            nostore.delay()
    finally:
        app.close()


def test_a_unique_task_id_sent_again_while_it_holds_the_lock_is_not_sent(
        memory_app: Celeriac) -> None:
    @memory_app.task(name="flow.byid", unique_for=30)
    def byid() -> None:
        return None

    first = byid.apply_async(task_id="fixed-id")
    assert byid.apply_async(task_id="fixed-id").id == first.id == "fixed-id"
    assert memory_app.transport.queue_length("celery") == 1
