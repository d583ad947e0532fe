"""The worker in-process on the memory transport: fast checks of the consumer logic."""

import time
from collections.abc import Iterator

import pytest

from celeriac import Celeriac, Hooks, Request, TaskRevoked
from celeriac.protocol import Message
from celeriac.testing import ThreadedWorker, wait_until


@pytest.fixture
def worker(memory_app: Celeriac) -> Iterator[ThreadedWorker]:
    with ThreadedWorker(memory_app) as w:
        yield w


def test_round_trip(memory_app: Celeriac) -> None:
    @memory_app.task
    def mul(x: int, y: int) -> int:
        return x * y

    with ThreadedWorker(memory_app):
        assert [mul.delay(i, 2).get(timeout=5) for i in range(20)] == [i * 2 for i in range(20)]


def test_priorities_run_highest_first(memory_app: Celeriac) -> None:
    order: list[int] = []

    @memory_app.task
    def record(p: int) -> None:
        order.append(p)

    for p in (1, 9, 5, 0):
        record.apply_async((p,), priority=p)
    with ThreadedWorker(memory_app):
        wait_until(lambda: len(order) == 4, 5)
    assert order == [9, 5, 1, 0]


def test_unknown_task_is_dead_lettered(memory_app: Celeriac, worker: ThreadedWorker) -> None:
    memory_app.send_task("nobody.knows", [1])
    dead = wait_until(memory_app.transport.dead_letters, 5)
    assert dead[0].reason == "unknown task 'nobody.knows'"


def test_expired_message_is_revoked(memory_app: Celeriac) -> None:
    @memory_app.task
    def f() -> None: ...

    r = f.apply_async(expires=0.01)
    time.sleep(0.02)  # sleep-ok: let it expire before a worker exists
    with ThreadedWorker(memory_app), pytest.raises(TaskRevoked):
        r.get(timeout=5)


def test_hooks_called_and_isolated(memory_app: Celeriac) -> None:
    seen: list[str] = []

    class Recorder(Hooks):
        def before_publish(self, message: Message, queue: str) -> None:
            seen.append(f"publish {queue}")

        def before_task(self, request: Request) -> None:
            raise RuntimeError("a broken hook must not break the task")

        def after_task(self, request: Request, state: str, retval: object) -> None:
            seen.append(f"after {state} {retval}")

    memory_app.add_hooks(Recorder())

    @memory_app.task
    def f() -> int:
        return 1

    with ThreadedWorker(memory_app):
        assert f.delay().get(timeout=5) == 1
        wait_until(lambda: len(seen) == 2, 5)
    assert seen == ["publish celery", "after SUCCESS 1"]


def test_warm_stop_gives_back_prefetched(memory_app: Celeriac) -> None:
    import threading

    gate = threading.Event()

    @memory_app.task
    def blocker() -> None:
        gate.wait(5)

    @memory_app.task
    def quick() -> None: ...

    # Queued before the worker starts: its first fetch takes all four (prefetch 4); a
    # worker already holding messages refetches only at its low-water mark (2).
    blocker.delay()
    for _ in range(3):
        quick.delay()
    w = ThreadedWorker(memory_app).start()
    wait_until(lambda: len(w.worker.consumer.reserved) == 3, 5)
    stopper = threading.Thread(target=w.stop)
    stopper.start()
    wait_until(lambda: memory_app.transport.queue_length("celery") == 3, 5)
    gate.set()
    stopper.join(5)
    assert w.exit_code == 0
