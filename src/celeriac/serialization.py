"""Serializers: JSON (orjson) by default, msgpack when installed, pickle only on request.

A reader accepts only the serializers listed in ``accept_content``; anything else raises
``ContentDisallowed`` before a byte of it is decoded.
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import orjson

from .errors import ConfigurationError, ContentDisallowed, DecodeError, EncodeError


@dataclass(frozen=True, slots=True)
class Serializer:
    name: str
    content_type: str
    dumps: Callable[[Any], bytes]
    loads: Callable[[bytes], Any]


def _json_default(obj: Any) -> Any:
    # orjson covers datetime, UUID, dataclasses and enums itself; these are what Celery's
    # JSON encoder adds. Anything else must fail loudly instead of turning into a string.
    if isinstance(obj, Decimal):
        return str(obj)
    raise TypeError(f"Type is not JSON serializable: {type(obj).__name__}")


def _json_dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, default=_json_default, option=orjson.OPT_NON_STR_KEYS)


def _msgpack_dumps(obj: Any) -> bytes:
    import msgpack

    return bytes(msgpack.packb(obj, use_bin_type=True, datetime=False))


def _msgpack_loads(data: bytes) -> Any:
    import msgpack

    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def _pickle_dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


SERIALIZERS: dict[str, Serializer] = {
    "json": Serializer("json", "application/json", _json_dumps, orjson.loads),
    "msgpack": Serializer("msgpack", "application/x-msgpack", _msgpack_dumps, _msgpack_loads),
    "pickle": Serializer("pickle", "application/x-python-serialize", _pickle_dumps, pickle.loads),
}
_BY_CONTENT_TYPE = {s.content_type: s for s in SERIALIZERS.values()}
_BY_CONTENT_TYPE["application/data"] = Serializer("raw", "application/data", bytes, bytes)


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
        raise EncodeError(f"cannot serialize with {serializer!r}: {exc}") from exc


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
