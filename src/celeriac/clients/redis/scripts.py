"""The Lua scripts of ``lua/`` as the connectors load them, and what a ``WAIT`` reply
means for a write."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import redis

from .lanes import sha1


class NotReplicated(redis.TimeoutError):
    """``WAIT`` came back with fewer replicas than ``replicas_ack`` asks for: the write is on
    the master only. Retried like a lost connection (the retry may duplicate a publish:
    delivery is at least once)."""


@functools.cache
def script_source(name: str, prelude: str | None = "common") -> str:
    """``lua/<name>.lua`` behind ``lua/<prelude>.lua``: by default ``common.lua``, the
    transport's key layout and shared helpers; another script's shared function (a
    chord's count); or nothing. Every Lua script of the package is a file here."""
    lua = resources.files("celeriac.clients.redis").joinpath("lua")
    head = lua.joinpath(f"{prelude}.lua").read_text() if prelude else ""
    return head + lua.joinpath(f"{name}.lua").read_text()


@functools.cache
def script_sha(name: str) -> str:
    return sha1(script_source(name))


def check_wait(acked: Any, replicas: int, timeout_ms: int) -> None:
    if int(acked) < replicas:
        raise NotReplicated(f"WAIT: {int(acked)} of {replicas} replica(s) acknowledged the "
                            f"write within {timeout_ms} ms (replicas_ack)")
