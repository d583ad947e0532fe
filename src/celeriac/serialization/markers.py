"""kombu's JSON type markers: the types JSON lacks, carried as Celery carries them.

kombu's JSON encoder writes a ``datetime``, ``date``, ``time``, ``Decimal``, ``UUID`` or
``bytes`` as ``{"__type__": <marker>, "__value__": <value>}`` and its decoder turns
that back into the value. A task argument or a result of these types therefore arrives
as the same type, between celeriac processes and between celeriac and Celery, either
way.

orjson writes most of JSON at C speed; the markers are added around it:

- ``default`` gets the datetimes (``OPT_PASSTHROUGH_DATETIME``), ``Decimal`` and
  ``bytes``, which orjson leaves to it;
- a ``UUID`` orjson would write itself, as a bare string: ``with_uuids`` marks them
  before encoding, and costs a walk only where a container holds something other than
  plain scalars;
- ``unmark`` walks a decoded value only when its bytes hold a marker at all.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any

TYPE = "__type__"
VALUE = "__value__"
MARKER = b'"__type__"'
"""What a JSON document holds when it holds a marker (a cheap test before a walk)."""

_PLAIN = frozenset({int, float, str, bool, type(None)})


def _mark(name: str, value: Any) -> dict[str, Any]:
    return {TYPE: name, VALUE: value}


def default(obj: Any) -> Any:
    """orjson's ``default``: the types it passes through, as kombu's markers. A type
    kombu's encoder does not know either fails loudly (``TypeError``), never turned into
    a string."""
    # datetime before date: a datetime is a date too.
    if isinstance(obj, datetime):
        return _mark("datetime", obj.isoformat())
    if isinstance(obj, date):
        return _mark("date", obj.isoformat())
    if isinstance(obj, time):
        return _mark("time", obj.isoformat())
    if isinstance(obj, Decimal):
        return _mark("decimal", str(obj))
    if isinstance(obj, (bytes, bytearray, memoryview)):
        raw = bytes(obj)
        try:
            return _mark("bytes", raw.decode("utf-8"))
        except UnicodeDecodeError:
            return _mark("base64", base64.b64encode(raw).decode("ascii"))
    raise TypeError(f"Type is not JSON serializable: {type(obj).__name__}")


def with_uuids(obj: Any) -> Any:
    """``obj`` with every ``UUID`` in its lists, tuples and dicts marked; ``obj`` itself
    (nothing copied) when it holds none, the common case, found without allocating."""
    return _marked(obj) if _holds_uuid(obj) else obj


def _holds_uuid(obj: Any) -> bool:
    if isinstance(obj, dict):
        items: Any = obj.values()
    elif isinstance(obj, (list, tuple)):
        items = obj
    else:
        return isinstance(obj, uuid.UUID)
    # A loop, not any() over a generator: this runs for every message sent.
    for item in items:  # noqa: SIM110
        if type(item) not in _PLAIN and _holds_uuid(item):
            return True
    return False


def _marked(obj: Any) -> Any:
    if isinstance(obj, uuid.UUID):
        return _mark("uuid", {"hex": obj.hex})
    if isinstance(obj, (list, tuple)):
        return [_marked(item) for item in obj]
    if isinstance(obj, dict):
        return {key: _marked(value) for key, value in obj.items()}
    return obj


_DECODERS: dict[str, Callable[[Any], Any]] = {
    "datetime": datetime.fromisoformat,
    "date": lambda value: datetime.fromisoformat(value).date(),
    "time": time.fromisoformat,
    "decimal": Decimal,
    "uuid": lambda value: uuid.UUID(**value),
    "bytes": lambda value: value.encode("utf-8"),
    "base64": lambda value: base64.b64decode(value.encode("ascii")),
}


def unmark(obj: Any) -> Any:
    """The value a decoded document stands for: every marker turned back into its type.
    An unknown marker is a ``ValueError`` (kombu's decoder refuses it too)."""
    kind = type(obj)
    if kind is list:
        return [unmark(item) for item in obj]
    if kind is not dict:
        return obj
    if len(obj) == 2 and TYPE in obj and VALUE in obj:
        decoder = _DECODERS.get(obj[TYPE])
        if decoder is None:
            raise ValueError(f"unsupported JSON type marker {obj[TYPE]!r}")
        return decoder(obj[VALUE])
    return {key: unmark(value) for key, value in obj.items()}
