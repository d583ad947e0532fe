"""Celery's ``celery.contrib.testing.manager``: ``Manager(app)``, the helpers Celery's
integration tests use around a running worker: waiting for results (``join``), for
tasks to reach a worker (``assert_accepted``, ``assert_received``), for something to
happen or not (``wait_for``, ``ensure_not_for_a_while``), and for the workers to be idle
(``wait_until_idle``).

Every wait is bounded: by its number of retries, and ``wait_until_idle`` by
``block_timeout``.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, TextIO

from ... import states
from ...errors import BrokerError, ResultTimeout
from ...result import AsyncResult, ResultSet

if TYPE_CHECKING:
    from ...app import Celeriac
    from ...control import Inspect

E_STILL_WAITING = "Still waiting for {0}.  Trying again {when}: {exc!r}"


class Sentinel(Exception):
    """Signifies the end of something (what ``true_or_raise`` raises while not yet)."""


def retry_over_time(fun: Callable[..., Any], catch: type[BaseException]
                    | tuple[type[BaseException], ...], args: Sequence[Any] = (),
                    kwargs: dict[str, Any] | None = None,
                    errback: Callable[[BaseException, Iterator[float], int], float] | None
                    = None, max_retries: int | None = None, interval_start: float = 2.0,
                    interval_step: float = 2.0, interval_max: float = 30.0,
                    timeout: float | None = None, **_: Any) -> Any:
    """Call ``fun`` until it does not raise ``catch``; re-raise after ``max_retries``
    retries or ``timeout`` seconds (kombu's ``retry_over_time``). Between calls it waits
    ``errback``'s answer, else the next interval (``interval_start``, growing by
    ``interval_step`` up to ``interval_max``)."""
    kwargs = kwargs or {}
    intervals = _intervals(interval_start, interval_step, interval_max)
    deadline = None if timeout is None else time.monotonic() + timeout
    for retries in itertools.count():
        try:
            return fun(*args, **kwargs)
        except catch as exc:
            out_of_time = deadline is not None and time.monotonic() >= deadline
            if (max_retries is not None and retries >= max_retries) or out_of_time:
                raise
            interval = errback(exc, intervals, retries) if errback else next(intervals)
            time.sleep(interval)  # sleep-ok: the back-off between two polls, as kombu's
    raise AssertionError("unreachable")  # pragma: no cover


def _intervals(start: float, step: float, maximum: float) -> Iterator[float]:
    interval = start
    while True:
        yield min(interval, maximum)
        interval += step


class ManagerMixin:
    """What ``Manager`` adds to something with an ``app``."""

    app: Celeriac

    def _init_manager(self, block_timeout: float = 30 * 60.0, no_join: bool = False,
                      stdout: TextIO | None = None, stderr: TextIO | None = None) -> None:
        self.stdout = sys.stdout if stdout is None else stdout
        self.stderr = sys.stderr if stderr is None else stderr
        self.connerrors: tuple[type[BaseException], ...] = (BrokerError, ConnectionError)
        self.block_timeout = block_timeout
        self.no_join = no_join

    def remark(self, s: str, sep: str = "-") -> None:
        print(f"{sep}{s}", file=self.stdout)

    def warn(self, s: str) -> None:
        print(s, file=self.stderr)

    def missing_results(self, r: Iterable[AsyncResult[Any]]) -> list[str]:
        return [res.id for res in r if not res.ready()]

    def wait_for(self, fun: Callable[..., Any], catch: type[BaseException]
                 | tuple[type[BaseException], ...], desc: str = "thing",
                 args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None,
                 errback: Callable[[BaseException, float, int], None] | None = None,
                 max_retries: int = 10, interval_start: float = 0.1,
                 interval_step: float = 0.5, interval_max: float = 5.0,
                 emit_warning: bool = False, **options: Any) -> Any:
        """Call ``fun`` until it does not raise ``catch`` (the event has not happened
        yet), at most ``max_retries`` more times."""

        def on_error(exc: BaseException, intervals: Iterator[float], retries: int) -> float:
            interval = next(intervals)
            if emit_warning:
                self.warn(E_STILL_WAITING.format(desc, when=f"in {interval:.2f} s", exc=exc))
            if errback:
                errback(exc, interval, retries)
            return interval

        return self.retry_over_time(
            fun, catch, args=args, kwargs=kwargs or {}, errback=on_error,
            max_retries=max_retries, interval_start=interval_start,
            interval_step=interval_step, interval_max=interval_max, **options)

    def ensure_not_for_a_while(self, fun: Callable[..., Any], catch: type[BaseException]
                               | tuple[type[BaseException], ...], desc: str = "thing",
                               max_retries: int = 20, interval_start: float = 0.1,
                               interval_step: float = 0.02, interval_max: float = 1.0,
                               emit_warning: bool = False, **options: Any) -> None:
        """Make sure something does not happen (at least for a while)."""
        try:
            self.wait_for(fun, catch, desc=desc, max_retries=max_retries,
                          interval_start=interval_start, interval_step=interval_step,
                          interval_max=interval_max, emit_warning=emit_warning)
        except catch:
            pass
        else:
            raise AssertionError(f"Should not have happened: {desc}")

    def retry_over_time(self, *args: Any, **kwargs: Any) -> Any:
        return retry_over_time(*args, **kwargs)

    def join(self, r: AsyncResult[Any] | ResultSet, propagate: bool = False,
             max_retries: int = 10, timeout: float | None = None, **kwargs: Any) -> Any:
        """Wait for ``r``'s results (a result or a set), retrying ``max_retries`` times
        past each ``timeout``."""
        if self.no_join:
            return None
        results = r if isinstance(r, ResultSet) else ResultSet([r], app=self.app)
        for _ in range(max_retries or 1):
            try:
                return results.get(timeout=timeout, propagate=propagate)
            except ResultTimeout as exc:
                waiting_for = self.missing_results(results)
                self.remark(f"Still waiting for {len(waiting_for)}/{len(results)}: "
                            f"[{', '.join(waiting_for)[:256]}]: {exc!r}", "!")
            except self.connerrors as exc:
                self.remark(f"join: connection lost: {exc!r}", "!")
        raise AssertionError("Test failed: Missing task results")

    def inspect(self, timeout: float = 3.0) -> Inspect:
        return self.app.control.inspect(timeout=timeout)

    def query_tasks(self, ids: Sequence[str], timeout: float = 0.5
                    ) -> Iterator[tuple[str, Any]]:
        tasks = self.inspect(timeout).query_task(*ids) or {}
        yield from tasks.items()

    def query_task_states(self, ids: Sequence[str], timeout: float = 0.5
                          ) -> defaultdict[str, set[str]]:
        found: defaultdict[str, set[str]] = defaultdict(set)
        for _hostname, reply in self.query_tasks(ids, timeout=timeout):
            for task_id, (state, _) in reply.items():
                found[state].add(task_id)
        return found

    def assert_accepted(self, ids: Sequence[str], interval: float = 0.5,
                        desc: str = "waiting for tasks to be accepted", **policy: Any) -> Any:
        return self.assert_task_worker_state(self.is_accepted, ids, interval=interval,
                                             desc=desc, **policy)

    def assert_received(self, ids: Sequence[str], interval: float = 0.5,
                        desc: str = "waiting for tasks to be received", **policy: Any) -> Any:
        return self.assert_task_worker_state(self.is_received, ids, interval=interval,
                                             desc=desc, **policy)

    def assert_result_tasks_in_progress_or_completed(
            self, async_results: Sequence[AsyncResult[Any]], interval: float = 0.5,
            desc: str = "waiting for tasks to be started or completed", **policy: Any) -> Any:
        return self.assert_task_state_from_result(
            self.is_result_task_in_progress, async_results, interval=interval, desc=desc,
            **policy)

    def assert_task_state_from_result(self, fun: Callable[..., bool],
                                      results: Sequence[AsyncResult[Any]],
                                      interval: float = 0.5, **policy: Any) -> Any:
        return self.wait_for(partial(self.true_or_raise, fun, results, timeout=interval),
                             (Sentinel,), **policy)

    @staticmethod
    def is_result_task_in_progress(results: Sequence[AsyncResult[Any]], **kwargs: Any
                                   ) -> bool:
        possible = (states.STARTED, states.SUCCESS)
        return all(result.state in possible for result in results)

    def assert_task_worker_state(self, fun: Callable[..., bool], ids: Sequence[str],
                                 interval: float = 0.5, **policy: Any) -> Any:
        return self.wait_for(partial(self.true_or_raise, fun, ids, timeout=interval),
                             (Sentinel,), **policy)

    def is_received(self, ids: Sequence[str], **kwargs: Any) -> bool:
        return self._ids_matches_state(["reserved", "active", "ready"], ids, **kwargs)

    def is_accepted(self, ids: Sequence[str], **kwargs: Any) -> bool:
        return self._ids_matches_state(["active", "ready"], ids, **kwargs)

    def _ids_matches_state(self, expected_states: Sequence[str], ids: Sequence[str],
                           timeout: float = 0.5) -> bool:
        found = self.query_task_states(ids, timeout=timeout)
        return all(any(t in found[k] for k in expected_states) for t in ids)

    def true_or_raise(self, fun: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        res = fun(*args, **kwargs)
        if not res:
            raise Sentinel()
        return res

    def wait_until_idle(self) -> None:
        """Purge the app's queues, then wait until no worker runs a task (at most
        ``block_timeout`` seconds: then ``AssertionError``)."""
        transport = self.app.transport
        for _ in range(1000):  # a worker's retries may refill a queue; bounded
            if sum(transport.purge(q) for q in self.app.default_queues) == 0:
                break
        inspect = self.app.control.inspect()
        deadline = time.monotonic() + self.block_timeout
        while time.monotonic() < deadline:
            replies = inspect.active() or {}
            if sum(len(tasks) for tasks in replies.values()) == 0:
                return
        raise AssertionError(f"workers still busy after {self.block_timeout} s")


class Manager(ManagerMixin):
    """Test helpers for task integration tests (Celery's)."""

    def __init__(self, app: Celeriac, **kwargs: Any) -> None:
        self.app = app
        self._init_manager(**kwargs)


__all__ = ["Manager", "ManagerMixin", "Sentinel", "retry_over_time"]
