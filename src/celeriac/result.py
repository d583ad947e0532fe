"""``AsyncResult``: the caller's handle on a task's state and return value;
``ResultSet``: several results waited on together; ``GroupResult``: a group's (a
``ResultSet`` with the group's id)."""

from __future__ import annotations

import builtins
import contextlib
import sys
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from . import errors, states
from .backends.base import GROUP_KEY_PREFIX as GROUP_KEY_PREFIX
from .backends.base import ResultMeta
from .backends.base import tuple_id as tuple_id
from .errors import IncompleteStream, ResultTimeout, TaskFailed, TaskRevoked
from .runtime.state import get_current_app

if TYPE_CHECKING:
    from .app import Celeriac

R = TypeVar("R")
_PROPAGATE_STATES = frozenset({states.FAILURE, states.REVOKED})
"""The states whose exception ``get()`` raises (Celery's ``PROPAGATE_STATES``)."""


class AsyncResult(Generic[R]):
    """A task's state and outcome as stored by the result backend."""

    def __init__(self, id: str, app: Celeriac | None = None,
                 task_name: str | None = None) -> None:
        if not isinstance(id, str) or not id:
            raise ValueError(f"id must be a non-empty string, got {id!r}")
        self.id = id
        self.app = app if app is not None else get_current_app()
        self.task_name = task_name
        self.parent: AsyncResult[Any] | GroupResult | None = None
        """The result of the task that sent this one, where the caller knows it."""
        self._ignored: bool | None = None
        self.sent_at: float | None = None
        """``time.monotonic()`` just before the task was sent, where this process sent it:
        a backend's wait position taken earlier than that precedes its result
        (``ResultBackend.wait_for``'s ``since``)."""

    @property
    def task_id(self) -> str:
        """Celery's other name for ``id``."""
        return self.id

    @property
    def ignored(self) -> bool:
        """True when the task stores no result (``ignore_result``): ``get()`` then
        returns None at once, as Celery's does. Set by whoever knows the call's option;
        otherwise the task's own ``ignore_result``, when it is registered here."""
        if self._ignored is not None:
            return self._ignored
        task = self.app.tasks.get(self.task_name) if self.task_name else None
        return bool(task is not None and task.ignore_result)

    @ignored.setter
    def ignored(self, value: bool) -> None:
        self._ignored = bool(value)

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.id}>"

    def __eq__(self, other: object) -> bool:
        # Equal to its id too, as Celery's (``parent_id in group_result.results``); the
        # hash is the id's, so a result and its id are one key.
        if isinstance(other, AsyncResult):
            return other.id == self.id
        if isinstance(other, str):
            return other == self.id
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.id)

    def _meta(self) -> ResultMeta | None:
        return self.app.backend.get(self.id)

    @property
    def state(self) -> str:
        meta = self._meta()
        return meta.state if meta else states.PENDING

    status = state

    @property
    def result(self) -> Any:
        """The return value, or the exception for a failed task; None while not ready."""
        meta = self._meta()
        if meta is None:
            return None
        if meta.state in states.EXCEPTION_STATES:
            return self._exception(meta)
        return meta.result

    @property
    def info(self) -> Any:
        """Celery's other name for ``result``: a custom state's meta while the task runs
        (``update_state``), then its value or exception."""
        return self.result

    @property
    def traceback(self) -> str | None:
        meta = self._meta()
        return meta.traceback if meta else None

    @property
    def date_done(self) -> datetime | None:
        """When the task finished (UTC), or None while it has not."""
        meta = self._meta()
        if meta is None or meta.date_done is None:
            return None
        return datetime.fromisoformat(meta.date_done)

    @property
    def retries(self) -> int:
        meta = self._meta()
        return meta.retries if meta else 0

    @property
    def name(self) -> str | None:
        """The task's name: as sent, or stored with ``result_extended``."""
        return self.task_name or self._extended("name")

    @property
    def args(self) -> Any:
        """The task's positional arguments (stored with ``result_extended``)."""
        return self._extended("args")

    @property
    def kwargs(self) -> Any:
        return self._extended("kwargs")

    @property
    def worker(self) -> Any:
        """The node name of the worker that ran it (``result_extended``)."""
        return self._extended("worker")

    @property
    def queue(self) -> Any:
        return self._extended("queue")

    @property
    def children(self) -> list[AsyncResult[Any] | GroupResult]:
        """What the task sent, stored with its result (Celery's): tasks it called, its
        chain's next step, its callbacks. Empty until it has finished."""
        meta = self._meta()
        if meta is None or not meta.children:
            return []
        return [result_from_tuple(t, self.app) for t in meta.children]

    def as_tuple(self) -> tuple[Any, Any]:
        """Celery's serializable form, ``((id, parent), None)``: what ``children``
        stores and ``result_from_tuple`` reads."""
        parent = self.parent.as_tuple() if self.parent is not None else None
        return (self.id, parent), None

    def iterdeps(self, intermediate: bool = False
                 ) -> Iterator[tuple[AsyncResult[Any] | GroupResult | None,
                                     AsyncResult[Any] | GroupResult]]:
        """``(parent, node)`` for this result and every result below it by
        ``children``, breadth first (Celery's). Raises ``IncompleteStream`` at a result
        that is not ready, unless ``intermediate``."""
        queue: list[tuple[Any, AsyncResult[Any] | GroupResult]] = [(None, self)]
        seen: set[str] = set()
        while queue:
            parent, node = queue.pop(0)
            if node.id in seen:  # a graph, not always a tree; and bounded
                continue
            seen.add(node.id)
            yield parent, node
            if node.ready():
                queue.extend((node, child) for child in node.children)
            elif not intermediate:
                raise IncompleteStream(f"result {node.id} is not ready")

    def collect(self, intermediate: bool = False, **get_options: Any
                ) -> Iterator[tuple[AsyncResult[Any] | GroupResult, Any]]:
        """``(result, value)`` for this result and everything it sent, recursively:
        the whole workflow a task started (Celery's ``collect``)."""
        for _, node in self.iterdeps(intermediate=intermediate):
            yield node, node.get(**get_options)

    def _extended(self, key: str) -> Any:
        meta = self._meta()
        return meta.extended.get(key) if meta is not None and meta.extended else None

    def ready(self) -> bool:
        return self.state in states.READY_STATES

    def successful(self) -> bool:
        return self.state == states.SUCCESS

    def failed(self) -> bool:
        return self.state == states.FAILURE

    def forget(self) -> None:
        self.app.backend.forget(self.id)

    def revoke(self, connection: Any = None, terminate: bool = False,
               signal: str | None = None, wait: bool = False, timeout: float | None = None
               ) -> None:
        """Ask the workers not to run this task (``app.control.revoke``); with
        ``terminate`` the child running it is killed with ``signal`` (SIGTERM). ``wait``
        waits up to ``timeout`` seconds for the workers' replies."""
        self.app.control.revoke(self.id, terminate=terminate, signal=signal or "SIGTERM",
                                reply=wait, timeout=timeout if timeout is not None else 1.0)

    def revoke_by_stamped_headers(self, headers: Any, connection: Any = None,
                                  terminate: bool = False, signal: str | None = None,
                                  wait: bool = False, timeout: float | None = None) -> None:
        """Ask the workers not to run any task stamped with ``headers`` (Celery's
        ``AsyncResult.revoke_by_stamped_headers``; ``app.control``'s, which this calls)."""
        self.app.control.revoke_by_stamped_headers(
            headers, terminate=terminate, signal=signal or "SIGTERM", reply=wait,
            timeout=timeout if timeout is not None else 1.0)

    def get(self, timeout: float | None = None, propagate: bool = True,
            follow_parents: bool = True) -> R:
        """Wait for the task to finish and return its value.

        A failed task re-raises its exception when ``propagate`` (the default); otherwise
        the exception is returned. Raises ``ResultTimeout`` after ``timeout`` seconds.
        A task that stores no result (``ignored``) returns None at once.

        With ``follow_parents`` (and ``propagate``), a failed parent's exception is
        raised first, the topmost first (Celery's): a chain or a chord whose earlier
        task failed raises that task's own exception, not the ``ChordError`` or the
        copy stored for the steps after it. Parents are read before waiting and again
        if this result is a failure.
        """
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout must be >= 0 or None, got {timeout!r}")
        if self.ignored:
            return cast(R, None)
        follow = follow_parents and propagate and self.parent is not None
        if follow:
            self._maybe_reraise_parent_error()
        meta = self.app.backend.wait_for([self.id], timeout, since=self.sent_at).get(self.id)
        if meta is None:
            raise ResultTimeout(f"task {self.id} not ready after {timeout}s")
        if follow and meta.state in _PROPAGATE_STATES:
            self._maybe_reraise_parent_error()
        return cast(R, self._outcome(meta, propagate))

    def _parents(self) -> Iterator[AsyncResult[Any] | GroupResult]:
        node = self.parent
        seen: set[int] = set()
        while node is not None and id(node) not in seen:  # bounded: a cycle stops it
            seen.add(id(node))
            yield node
            node = node.parent

    def _maybe_reraise_parent_error(self) -> None:
        """Raise the exception of the topmost parent that failed, if one did (no wait)."""
        for node in reversed(list(self._parents())):
            node.maybe_throw()

    def maybe_throw(self, propagate: bool = True, callback: Any = None) -> Any:
        """Raise this task's exception if it failed (no wait); else its value or None
        (Celery's ``maybe_throw``)."""
        meta = self._meta()
        if meta is None:
            return None
        if meta.state in _PROPAGATE_STATES and propagate:
            raise self._exception(meta)
        value = self._exception(meta) if meta.state in states.EXCEPTION_STATES \
            else meta.result
        if callback is not None:
            callback(self.id, value)
        return value

    maybe_reraise = maybe_throw

    def wait(self, timeout: float | None = None, propagate: bool = True) -> R:
        """Celery's other name for ``get``."""
        return self.get(timeout, propagate)

    async def aget(self, timeout: float | None = None, propagate: bool = True) -> R:
        """``get()`` for async code; waits in a thread so the event loop keeps running."""
        import asyncio  # deferred: ~20 ms (ssl, subprocess); an awaiting caller has it

        return await asyncio.to_thread(self.get, timeout, propagate)

    def _outcome(self, meta: ResultMeta, propagate: bool) -> Any:
        if meta.state == states.SUCCESS:
            return meta.result
        exc = self._exception(meta)
        if propagate:
            raise exc
        return exc

    def _exception(self, meta: ResultMeta) -> BaseException:
        if isinstance(meta.result, BaseException):  # eager results keep the real object
            return meta.result
        if meta.state == states.REVOKED:
            return TaskRevoked(f"task {self.id} was revoked: {_message(meta.result)}")
        return rebuild_exception(meta.result, meta.traceback,
                                 self.app.settings.result_exception_allowlist)


def _message(data: Any) -> str:
    if isinstance(data, dict):
        msg = data.get("exc_message")
        return " ".join(map(str, msg)) if isinstance(msg, list) else str(msg)
    return str(data)


_CELERIAC_EXCEPTIONS = {
    name: obj for name, obj in vars(errors).items()
    if isinstance(obj, type) and issubclass(obj, Exception)
}


def rebuild_exception(
    data: Any, traceback: str | None, allowlist: tuple[type[BaseException], ...] = ()
) -> BaseException:
    """Re-create a stored exception if its type is allowed, else a ``TaskFailed``.

    Allowed: builtin exceptions, celeriac's own, the classes in ``allowlist``, and any
    exception class whose module this process has imported already (the task's own
    types, which Celery re-raises too). Nothing is ever imported on the say-so of the
    stored data: a type the reader has not imported stays a ``TaskFailed``.
    """
    if not isinstance(data, dict):
        return TaskFailed("Exception", str(data), traceback)
    exc_type = str(data.get("exc_type", "Exception"))
    module = data.get("exc_module")
    args = data.get("exc_message", [])
    args = args if isinstance(args, list) else [args]
    cls: type[BaseException] | None = None
    if module == "builtins":
        candidate = getattr(builtins, exc_type, None)
        if isinstance(candidate, type) and issubclass(candidate, Exception):
            cls = candidate
    elif module == errors.__name__:
        cls = _CELERIAC_EXCEPTIONS.get(exc_type)
    else:
        cls = next((c for c in allowlist
                    if c.__qualname__ == exc_type and c.__module__ == module), None) \
            or _imported_class(module, exc_type)
    if cls is not None:
        try:
            exc = cls(*args)
        except Exception:
            exc = None
        if exc is not None:
            exc.__notes__ = [f"raised remotely:\n{traceback}"] if traceback else []
            return exc
    message = " ".join(map(str, args))
    name = exc_type if not module or module == "builtins" else f"{module}.{exc_type}"
    return TaskFailed(name, message, traceback, tuple(args))


def _imported_class(module: Any, qualname: str) -> type[BaseException] | None:
    """The exception class ``module.qualname`` when this process has imported its module
    already (a task's own exception type, as Celery re-raises it); never imports one."""
    found: Any = sys.modules.get(module) if isinstance(module, str) else None
    for part in qualname.split("."):
        if found is None or part.startswith("<"):  # "<locals>": not reachable by name
            return None
        found = getattr(found, part, None)
    if isinstance(found, type) and issubclass(found, Exception):
        return found
    return None


class EagerResult(AsyncResult[R]):
    """The outcome of ``Task.apply()``: already known, nothing stored."""

    def __init__(self, id: str, app: Celeriac, task_name: str, meta: ResultMeta) -> None:
        super().__init__(id, app, task_name)
        self._eager_meta = meta

    def _meta(self) -> ResultMeta | None:
        return self._eager_meta

    def get(self, timeout: float | None = None, propagate: bool = True,
            follow_parents: bool = True) -> R:
        return cast(R, self._outcome(self._eager_meta, propagate))

    def forget(self) -> None:
        pass


_READ_BATCH = 500
"""Ids per backend read (what ``wait_for`` reads at once too)."""


class ResultSet:
    """Results read and waited on together, in the order given (Celery's ``ResultSet``);
    ``GroupResult`` is one with a group id.

    Reads go to the backend in batches of ids, one round trip per batch, never one per
    member; eager members (``group.apply()``) are answered without the backend."""

    def __init__(self, results: Iterable[AsyncResult[Any]] | None = None,
                 app: Celeriac | None = None) -> None:
        self.results: list[AsyncResult[Any]] = list(results or ())
        if app is None:
            app = self.results[0].app if self.results else get_current_app()
        self.app = app

    def _label(self) -> str:
        return "result set"

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: [{', '.join(r.id for r in self.results)}]>"

    def __len__(self) -> int:
        return len(self.results)

    def __iter__(self) -> Iterator[AsyncResult[Any]]:
        return iter(self.results)

    def __getitem__(self, index: int) -> AsyncResult[Any]:
        return self.results[index]

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.results == self.results

    __hash__ = None  # type: ignore[assignment]  # mutable, as Celery's

    # -- the set (Celery's) --------------------------------------------------------------
    def add(self, result: AsyncResult[Any]) -> None:
        """Add ``result`` unless it is in the set already."""
        if result not in self.results:
            self.results.append(result)

    def update(self, results: Iterable[AsyncResult[Any]]) -> None:
        """Add each of ``results`` not in the set already."""
        for result in results:
            self.add(result)

    def remove(self, result: AsyncResult[Any] | str) -> None:
        """Remove ``result`` (or the result of that id); ``KeyError`` if not in the set."""
        if isinstance(result, str):
            result = AsyncResult(result, self.app)
        try:
            self.results.remove(result)
        except ValueError:
            raise KeyError(result) from None

    def discard(self, result: AsyncResult[Any] | str) -> None:
        """Remove ``result`` if it is in the set."""
        with contextlib.suppress(KeyError):
            self.remove(result)

    def clear(self) -> None:
        self.results.clear()

    # -- reading -------------------------------------------------------------------------
    def _metas(self) -> dict[str, ResultMeta]:
        """Every member's stored result that exists: eager ones as they are, the others
        read ``_READ_BATCH`` ids per round trip."""
        found: dict[str, ResultMeta] = {}
        remote: list[str] = []
        for r in self.results:
            meta = r._eager_meta if isinstance(r, EagerResult) else None
            if meta is not None:
                found[r.id] = meta
            else:
                remote.append(r.id)
        for start in range(0, len(remote), _READ_BATCH):
            found.update(self.app.backend.get_many(remote[start:start + _READ_BATCH]))
        return found

    def completed_count(self) -> int:
        """How many members succeeded (Celery counts successes, not failures)."""
        return sum(1 for m in self._metas().values() if m.state == states.SUCCESS)

    def ready(self) -> bool:
        metas = self._metas()
        return all(r.id in metas and metas[r.id].ready for r in self.results)

    def waiting(self) -> bool:
        return not self.ready()

    def successful(self) -> bool:
        metas = self._metas()
        return all(r.id in metas and metas[r.id].state == states.SUCCESS
                   for r in self.results)

    def failed(self) -> bool:
        return any(m.state == states.FAILURE for m in self._metas().values())

    def maybe_throw(self, callback: Any = None, propagate: bool = True) -> None:
        """Raise the first failed member's exception, in member order (no wait; Celery's
        ``ResultSet.maybe_throw``), read in one batch."""
        metas = self._metas()
        for r in self.results:
            meta = metas.get(r.id)
            if meta is None:
                continue
            if meta.state in _PROPAGATE_STATES and propagate:
                raise r._exception(meta)
            if callback is not None:
                callback(r.id, meta.result)

    maybe_reraise = maybe_throw

    def get(self, timeout: float | None = None, propagate: bool = True) -> list[Any]:
        """Every member's value, in member order, once all are ready.

        One ``backend.wait_for`` over all the ids (it reads in batches as results land);
        ``ResultTimeout`` after ``timeout`` seconds. A failed member re-raises its
        exception when ``propagate``, else its exception takes its place in the list."""
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout must be >= 0 or None, got {timeout!r}")
        metas: dict[str, ResultMeta] = {}
        remote: list[str] = []
        for r in self.results:
            if isinstance(r, EagerResult):
                metas[r.id] = r._eager_meta
            else:
                remote.append(r.id)
        if remote:
            metas.update(self.app.backend.wait_for(remote, timeout))
        missing = [r.id for r in self.results if r.id not in metas]
        if missing:
            raise ResultTimeout(f"{self._label()}: {len(missing)} of {len(self.results)} "
                                f"results not ready after {timeout}s (first: {missing[0]})")
        return [r._outcome(metas[r.id], propagate) for r in self.results]

    def join(self, timeout: float | None = None, propagate: bool = True) -> list[Any]:
        """Celery's other name for ``get``."""
        return self.get(timeout, propagate)

    async def aget(self, timeout: float | None = None, propagate: bool = True) -> list[Any]:
        import asyncio  # deferred: ~20 ms (ssl, subprocess); an awaiting caller has it

        return await asyncio.to_thread(self.get, timeout, propagate)

    # -- acting ---------------------------------------------------------------------------
    def revoke(self, connection: Any = None, terminate: bool = False,
               signal: str | None = None, wait: bool = False, timeout: float | None = None
               ) -> None:
        """Revoke every member (``app.control.revoke`` of their ids, in one command)."""
        self.app.control.revoke([r.id for r in self.results], terminate=terminate,
                                signal=signal or "SIGTERM", reply=wait,
                                timeout=timeout if timeout is not None else 1.0)

    def forget(self) -> None:
        """Forget every member's stored result (not a saved group: ``delete``)."""
        for r in self.results:
            r.forget()


class GroupResult(ResultSet):
    """The results of a group's members, in member order (Celery's ``GroupResult``): a
    ``ResultSet`` with the group's id, which ``save`` and ``restore`` keep it under."""

    def __init__(self, id: str, results: Sequence[AsyncResult[Any]] | None = None,
                 app: Celeriac | None = None, parent: AsyncResult[Any] | None = None) -> None:
        if not isinstance(id, str) or not id:
            raise ValueError(f"id must be a non-empty string, got {id!r}")
        super().__init__(results, app)
        self.id = id
        self.parent = parent
        """The result of the step before this group in a chain, where known."""

    def _label(self) -> str:
        return f"group {self.id}"

    @property
    def children(self) -> list[AsyncResult[Any]]:
        return self.results

    def as_tuple(self) -> tuple[Any, Any]:
        """Celery's serializable form, ``((id, parent), [member tuples])``."""
        parent = self.parent.as_tuple() if self.parent is not None else None
        return (self.id, parent), [r.as_tuple() for r in self.results]

    def __repr__(self) -> str:
        return f"<GroupResult: {self.id} [{', '.join(r.id for r in self.results)}]>"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return other == self.id  # as Celery's
        return (isinstance(other, GroupResult) and other.id == self.id
                and other.results == self.results)

    def __hash__(self) -> int:  # type: ignore[override]  # a group is known by its id
        return hash(self.id)

    def save(self) -> GroupResult:
        """Store the member ids under the group id, for ``GroupResult.restore``."""
        self.app.backend.store(GROUP_KEY_PREFIX + self.id, states.SUCCESS,
                               {"group_id": self.id, "results": [r.id for r in self.results]})
        return self

    def delete(self) -> None:
        """Remove what ``save`` stored."""
        self.app.backend.forget(GROUP_KEY_PREFIX + self.id)

    @classmethod
    def restore(cls, id: str, app: Celeriac | None = None) -> GroupResult | None:
        """The group ``save`` stored under ``id``; None if none is (or it expired)."""
        if app is None:
            app = get_current_app()
        meta = app.backend.get(GROUP_KEY_PREFIX + id)
        if meta is None or not isinstance(meta.result, dict):
            return None
        ids = meta.result.get("results") or []
        return cls(id, [AsyncResult(str(i), app) for i in ids], app)


def result_from_tuple(value: Any, app: Celeriac) -> AsyncResult[Any] | GroupResult:
    """The result ``as_tuple`` made ``value`` from (Celery's ``result_from_tuple``); a
    bare id is taken as a task's."""
    if isinstance(value, str):
        return AsyncResult(value, app)
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ValueError(f"not a result tuple: {value!r}")
    head, nodes = value
    task_id, parent = head if isinstance(head, (list, tuple)) else (head, None)
    result: AsyncResult[Any] | GroupResult
    if nodes is not None:
        # A member that is itself a group is read as one (Celery nests them too).
        members = [cast(AsyncResult[Any], result_from_tuple(n, app)) for n in nodes]
        result = GroupResult(str(task_id), members, app)
    else:
        result = AsyncResult(str(task_id), app)
    if parent:
        result.parent = result_from_tuple(parent, app)
    return result
