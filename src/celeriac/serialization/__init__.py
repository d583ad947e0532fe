"""Serializers: JSON (orjson) by default, msgpack when installed, pickle only on request.

A reader accepts only the serializers listed in ``accept_content``; anything else raises
``ContentDisallowed`` before a byte of it is decoded.

Nesting has limits: orjson encodes at most 254 levels of lists and dicts, msgpack 1025,
pickle as deep as Python's recursion limit lets it go. Past them (or for a list or dict
that contains itself) the ``EncodeError`` says so, not just the value's type.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from ..errors import ConfigurationError, ContentDisallowed, DecodeError, EncodeError
from . import markers


@dataclass(frozen=True, slots=True)
class Serializer:
    name: str
    content_type: str
    dumps: Callable[[Any], bytes]
    loads: Callable[[bytes], Any]


def _json_dumps(obj: Any) -> bytes:
    # kombu's type markers for what JSON lacks (markers.py), so a datetime, Decimal, UUID
    # or bytes argument arrives as itself here and at a Celery worker alike.
    return orjson.dumps(markers.with_uuids(obj), default=markers.default,
                        option=orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME)


def _json_loads(data: bytes) -> Any:
    value = orjson.loads(data)
    return markers.unmark(value) if markers.MARKER in data else value


def _msgpack_dumps(obj: Any) -> bytes:
    import msgpack  # deferred here and below: msgpack is optional (the msgpack extra)

    return bytes(msgpack.packb(obj, use_bin_type=True, datetime=False))


def _msgpack_loads(data: bytes) -> Any:
    import msgpack

    return msgpack.unpackb(data, raw=False, strict_map_key=False)


# pickle is imported when first used: only deployments that list it in accept_content
# need it, and it is a few ms of every producer's import (issue 30).
def _pickle_dumps(obj: Any) -> bytes:
    import pickle

    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _pickle_loads(data: bytes) -> Any:
    import pickle

    return pickle.loads(data)


SERIALIZERS: dict[str, Serializer] = {
    "json": Serializer("json", "application/json", _json_dumps, _json_loads),
    "msgpack": Serializer("msgpack", "application/x-msgpack", _msgpack_dumps, _msgpack_loads),
    "pickle": Serializer("pickle", "application/x-python-serialize", _pickle_dumps, _pickle_loads),
}
_BY_CONTENT_TYPE = {s.content_type: s for s in SERIALIZERS.values()}
RAW = Serializer("raw", "application/data", bytes, bytes)
_BY_CONTENT_TYPE["application/data"] = RAW


def _not_set_up(_: Any) -> Any:
    raise ConfigurationError("the auth serializer signs with keys app.setup_security() "
                             "reads: call it after configuring the security_* settings")


# Celery's signed messages (signing.py): known by name, so settings may name it before
# app.setup_security() registers the real one.
AUTH_UNSET = Serializer("auth", "application/data", _not_set_up, _not_set_up)
SERIALIZERS["auth"] = AUTH_UNSET


def register(serializer: Serializer) -> None:
    """Add or replace a serializer, by name and content type (``signing.py`` registers
    ``auth`` this way)."""
    SERIALIZERS[serializer.name] = serializer
    _BY_CONTENT_TYPE[serializer.content_type] = serializer


def get_serializer(name: str) -> Serializer:
    try:
        serializer = SERIALIZERS[name]
    except KeyError:
        raise ConfigurationError(
            f"unknown serializer {name!r}; known: {', '.join(sorted(SERIALIZERS))}"
        ) from None
    if name == "msgpack":
        try:
            import msgpack  # noqa: F401
        except ImportError:
            raise ConfigurationError(
                "serializer 'msgpack' needs the msgpack package: pip install 'celeriac[msgpack]'"
            ) from None
    return serializer


@functools.lru_cache(maxsize=32)
def accepted_content_types(accept: tuple[str, ...]) -> frozenset[str]:
    """Content types for ``accept_content`` names (names or content types both work).

    ``accept`` must be hashable (settings hold a tuple); results are cached because the
    executing process asks for every task.
    """
    types = set()
    for item in accept:
        types.add(item if "/" in item else get_serializer(item).content_type)
    return frozenset(types)


def dumps(obj: Any, serializer: str = "json") -> tuple[str, bytes]:
    """Serialize ``obj``; returns ``(content_type, data)``."""
    s = get_serializer(serializer)
    try:
        return s.content_type, s.dumps(obj)
    except Exception as exc:
        reason = _deep(obj, serializer) if too_deep(exc) else str(exc)
        raise EncodeError(f"cannot serialize with {serializer!r}: {reason}") from exc


def _deep(obj: Any, serializer: str) -> str:
    # No count of levels: a caller may have wrapped the value (a result in its meta).
    limit = DEPTH_LIMITS.get(serializer)
    if limit is None:
        return "nested too deeply for Python's recursion limit"
    if nesting(obj) is None:
        return "a list or dict in it contains itself"
    return (f"nested too deeply: over the {limit} levels of lists and dicts the "
            f"{serializer!r} serializer encodes")


DEPTH_LIMITS = {"json": 254, "msgpack": 1025}
"""Levels of lists and dicts each serializer encodes at most: orjson's limit, and
msgpack's (its recursion limit, 1024, counts the levels below the top one). Pickle's is
Python's recursion limit, which depends on the stack: not a number to state."""

_CONTAINERS = (list, tuple, dict, set, frozenset)


def too_deep(exc: BaseException | None) -> bool:
    """Whether a serializer's error means its value was nested past the serializer's
    limit, or contains itself: orjson, msgpack and pickle each say it their own way."""
    if isinstance(exc, RecursionError):
        return True
    return isinstance(exc, (TypeError, ValueError)) and str(exc).rstrip(".").lower() in (
        "recursion limit reached", "recursion limit exceeded")


def nesting(obj: Any) -> int | None:
    """Levels of lists, tuples, dicts and sets in ``obj`` (``[]`` is 1, ``[[]]`` 2);
    None if one of them contains itself. Iterative: the values it measures are the
    ones too deep to recurse into."""
    if not isinstance(obj, _CONTAINERS):
        return 0
    done: dict[int, int] = {}  # shared values are measured once
    on_path = {id(obj)}
    stack: list[tuple[Any, Iterator[Any], int]] = [(obj, _children(obj), 0)]
    while stack:
        node, children, deepest = stack[-1]
        for child in children:
            if not isinstance(child, _CONTAINERS):
                continue
            if id(child) in on_path:
                return None
            if id(child) in done:
                deepest = max(deepest, done[id(child)])
                continue
            stack[-1] = (node, children, deepest)
            stack.append((child, _children(child), 0))
            on_path.add(id(child))
            break
        else:
            stack.pop()
            on_path.discard(id(node))
            done[id(node)] = deepest + 1
            if stack:
                parent, rest, parent_deepest = stack[-1]
                stack[-1] = (parent, rest, max(parent_deepest, deepest + 1))
    return done[id(obj)]


def _children(obj: Any) -> Iterator[Any]:
    return iter(obj.values()) if isinstance(obj, dict) else iter(obj)


def depth_problem(obj: Any, serializer: str, enclosing: int = 0, where: str = ""
                  ) -> str | None:
    """When its nesting is why ``obj`` cannot be encoded, the rest of a sentence saying
    so (``"is nested too deeply: ..."``), else None. ``obj`` sits ``enclosing`` levels
    down in what is encoded; ``where`` ends the sentence (``" in a task's argument"``)."""
    limit = DEPTH_LIMITS.get(serializer)
    if limit is None:
        # Python's recursion limit: only trying says whether it is reached.
        try:
            get_serializer(serializer).dumps(obj)
        except RecursionError:
            return (f"is nested too deeply: {nesting(obj)} levels of lists and dicts, more "
                    f"than the {serializer!r} serializer encodes within Python's recursion "
                    f"limit")
        except Exception:
            return None
        return None
    levels = nesting(obj)
    if levels is None:
        return ("contains itself (a list or dict inside itself), which the "
                f"{serializer!r} serializer cannot encode")
    if levels + enclosing <= limit:
        return None
    return (f"is nested too deeply: {levels} levels of lists and dicts, over the "
            f"{limit - enclosing} the {serializer!r} serializer encodes{where}")


def loads(data: bytes, content_type: str, accept: frozenset[str]) -> Any:
    """Deserialize ``data``, refusing content types outside ``accept``."""
    if content_type not in accept:
        raise ContentDisallowed(
            f"content type {content_type!r} is not accepted (accept_content: {sorted(accept)})"
        )
    s = _BY_CONTENT_TYPE.get(content_type)
    if s is None:
        raise DecodeError(f"unknown content type {content_type!r}")
    try:
        return s.loads(data)
    except Exception as exc:
        raise DecodeError(f"cannot decode {content_type} body: {exc}") from exc
