"""The pieces of a task message the producer checks and builds before publishing: a
bulk call's arguments, the priority, an absolute ``expires``, and the body (with an
``EncodeError`` that names the argument that cannot be encoded)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from .. import serialization
from ..errors import EncodeError
from .options import EMPTY_EMBED


def split_call(call: Any) -> tuple[Sequence[Any], Mapping[str, Any] | None]:
    if (isinstance(call, tuple) and len(call) == 2 and isinstance(call[1], Mapping)
            and isinstance(call[0], (list, tuple))):
        return call[0], call[1]
    if isinstance(call, (list, tuple)):
        return call, None
    raise TypeError(f"each call must be an args sequence or (args, kwargs), got {call!r}")


def validate_priority(priority: Any) -> None:
    if priority is not None and (not isinstance(priority, int) or not 0 <= priority <= 9):
        raise ValueError(f"priority must be an int from 0 to 9, got {priority!r}")


def absolute_time(expires: float | timedelta | datetime | None, now: datetime) -> datetime | None:
    if expires is None:
        return None
    if isinstance(expires, datetime):
        return expires if expires.tzinfo else expires.replace(tzinfo=UTC)
    if isinstance(expires, timedelta):
        return now + expires
    if isinstance(expires, (int, float)):
        return now + timedelta(seconds=expires)
    raise TypeError(f"expires must be seconds, a timedelta or a datetime, got {expires!r}")


def encode_body(name: str, args: list[Any], kwargs: dict[str, Any], serializer: str,
                embed: Mapping[str, Any] | None = None) -> tuple[str, bytes]:
    """``[args, kwargs, embed]`` encoded once (``embed`` over ``EMPTY_EMBED``)."""
    try:
        return serialization.dumps(
            (args, kwargs, {**EMPTY_EMBED, **embed} if embed else EMPTY_EMBED), serializer)
    except EncodeError as exc:
        failure = exc
    # Find the culprit so the message names the argument, not just the type.
    labelled = [*((f"argument {i}", a) for i, a in enumerate(args)),
                *((f"keyword argument {k!r}", v) for k, v in kwargs.items())]
    if serialization.too_deep(failure.__cause__):
        # The limit is the body's: an argument sits two levels down in it ([args, kwargs,
        # embed], then args), so one may fail there and yet encode on its own.
        for label, value in labelled:
            problem = serialization.depth_problem(value, serializer, enclosing=2,
                                                  where=" in a task's argument")
            if problem:
                raise EncodeError(f"cannot send {name}: {label} {problem}; nothing was "
                                  f"published") from failure
    for label, value in labelled:
        try:
            serialization.dumps(value, serializer)
        except EncodeError as exc:
            raise EncodeError(
                f"cannot send {name}: {label} has type {type(value).__name__}, which the "
                f"{serializer!r} serializer cannot encode ({exc.__cause__}); nothing was published"
            ) from exc
    if embed:
        raise failure  # the arguments encode: the embed (a signature's) does not
    raise EncodeError(f"cannot send {name}: arguments cannot be encoded with {serializer!r}")
