"""A task's arguments checked where it is sent (Celery's ``typing=True``) and converted
to pydantic models where it runs (``pydantic=True``); how a call's links, eager calls and
protocol headers are read."""

from __future__ import annotations

import functools
import importlib
import inspect
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from ..errors import ConfigurationError


def argument_checker(fn: Callable[..., Any], bound: bool) -> Callable[..., Any] | None:
    """A function with ``fn``'s parameters (without ``self`` for a bound task) that does
    nothing: calling it raises the ``TypeError`` calling ``fn`` would (Celery's
    ``head_from_fun``). None when ``fn``'s signature cannot be read."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    params = list(sig.parameters.values())
    if bound and params and params[0].kind in (inspect.Parameter.POSITIONAL_ONLY,
                                               inspect.Parameter.POSITIONAL_OR_KEYWORD):
        params = params[1:]
    # Defaults and annotations dropped: only the names and kinds matter to binding.
    stub = [p.replace(annotation=inspect.Parameter.empty,
                      default=None if p.default is not inspect.Parameter.empty
                      else inspect.Parameter.empty) for p in params]
    text = str(sig.replace(parameters=stub, return_annotation=inspect.Signature.empty))
    namespace: dict[str, Any] = {}
    name = fn.__name__ if fn.__name__.isidentifier() else "check"
    exec(f"def {name}{text}:\n    pass", namespace)  # the parameters' names: identifiers
    return namespace[name]  # type: ignore[no-any-return]


def pydantic_wrapper(fn: Callable[..., Any], name: str, bound: bool, strict: bool,
                     context: Mapping[str, Any] | None,
                     dump_kwargs: Mapping[str, Any] | None, app: Any) -> Callable[..., Any]:
    """Celery 5.5's ``pydantic=True``: each argument annotated with a pydantic model (or
    ``Optional`` of one, given a value) is validated into it (``model_validate``), and a
    returned model that is an instance of the return annotation is sent as its
    ``model_dump(mode="json")``. pydantic is imported here, where such a task runs."""
    try:
        pydantic: Any = importlib.import_module("pydantic")  # optional: only these tasks
    except ModuleNotFoundError as exc:
        raise ConfigurationError(
            f"task {name!r} has pydantic=True: install pydantic to use pydantic model "
            "arguments and results") from exc
    base = pydantic.BaseModel
    sig = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except (NameError, AttributeError, TypeError):
        hints = {}

    def model_of(annotation: Any, value: Any) -> Any:
        optional = _optional_arg(annotation)
        if optional is not None and value is not None:
            annotation = optional
        if isinstance(annotation, type) and issubclass(annotation, base):
            return annotation
        return None

    ctx = {**(context or {}), "celery_app": app, "celery_task_name": name}
    dump = {"mode": "json", **(dump_kwargs or {})}
    returns = hints.get("return", sig.return_annotation)
    returns = _optional_arg(returns) or returns

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound_args = sig.bind(*args, **kwargs)
        for i, (arg, given) in enumerate(bound_args.arguments.items()):
            if bound and i == 0:
                continue  # the task itself
            model = model_of(hints.get(arg, sig.parameters[arg].annotation), given)
            if model is not None:
                bound_args.arguments[arg] = model.model_validate(given, strict=strict,
                                                                 context=ctx)
        value: Any = fn(*bound_args.args, **bound_args.kwargs)
        if isinstance(returns, type) and isinstance(value, base) and isinstance(value, returns):
            dumped: Any = value
            return dumped.model_dump(**dump)
        return value

    return wrapper


def _optional_arg(annotation: Any) -> Any:
    """``X`` of ``Optional[X]`` / ``X | None``; else None."""
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return None
    members = typing.get_args(annotation)
    if len(members) != 2 or type(None) not in members:
        return None
    return next(m for m in members if m is not type(None))


STANDARD_HEADERS: Final = frozenset({
    "lang", "task", "id", "shadow", "eta", "expires", "group", "group_index", "retries",
    "timelimit", "root_id", "parent_id", "argsrepr", "kwargsrepr", "origin",
    "ignore_result", "compression"})
"""Protocol v2's headers (and the compression's): what ``retry`` makes anew; the others
are the call's custom headers, which it keeps (Celery's)."""


def listed(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def eager_call(call: Any) -> tuple[Sequence[Any], Mapping[str, Any] | None]:
    if isinstance(call, tuple) and len(call) == 2 and isinstance(call[1], Mapping):
        return call[0], call[1]
    return call, None
