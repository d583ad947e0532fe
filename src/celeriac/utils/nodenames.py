"""``celeriac.utils.nodenames``, Celery's ``celery.utils.nodenames``: node names
(``name@host``), Celery's ``anon_nodename``, and the ``%``-format of ``-n``,
``--logfile`` and ``--pidfile`` as Celery has them, so that ``-n w1@%h --pidfile %n.pid``
means the same.

=====  ==================================================================
``%h`` the full host name, domain included (``socket.gethostname()``)
``%n`` the host name before its first dot; in a node format, the node's name
       (``w1`` of ``w1@host``)
``%d`` the domain: the host name after its first dot
``%i`` the pool process index, ``0`` in the main process
``%I`` the index with a ``-`` before it, empty in the main process
``%p`` the full node name (node formats only)
``%%`` a literal ``%``
=====  ==================================================================

celeriac's prefork children are not numbered and write to the log file their parent
opened, so ``%i``/``%I`` always expand as in the main process (``0`` and nothing).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Mapping

NODENAME_SEP = "@"
NODENAME_DEFAULT = "celeriac"

_FORMAT = re.compile(r"%(\w|%)")


def gethostname() -> str:
    return socket.gethostname()


def nodename(name: str, hostname: str) -> str:
    """``name@hostname``."""
    return f"{name}{NODENAME_SEP}{hostname}"


def nodesplit(name: str) -> tuple[str | None, str]:
    """``("w1", "host")`` of ``w1@host``; ``(None, "host")`` of a bare ``host``."""
    short, sep, host = name.partition(NODENAME_SEP)
    return (short, host) if sep else (None, short)


def default_nodename(hostname: str | None) -> str:
    """Fill in what a node name leaves out: ``celeriac@`` and the host name."""
    name, host = nodesplit(hostname or "")
    return nodename(name or NODENAME_DEFAULT, host or gethostname())


def _index(index: int, prefix: str, main: str) -> str:
    return f"{prefix}{index}" if index else main


def simple_format(s: str, keys: Mapping[str, str | Callable[[], str]]) -> str:
    """Replace each ``%x`` by ``keys["x"]`` (called if callable); ``%%`` is ``%``.

    An unknown key is a ``ValueError``: a typo would otherwise become a file name.
    """
    def resolve(match: re.Match[str]) -> str:
        key = match.group(1)
        if key == "%":
            value = keys.get("%", "%")  # `multi` keeps it escaped for the worker
            return value() if callable(value) else value
        try:
            value = keys[key]
        except KeyError:
            raise ValueError(f"unknown format %{key}") from None
        return value() if callable(value) else value

    return _FORMAT.sub(resolve, s)


def host_format(s: str, host: str | None = None, name: str | None = None, *,
                index: int = 0, extra: Mapping[str, str] | None = None) -> str:
    """Expand ``%h %n %d %i %I`` (and ``extra`` keys, which win) in ``s``."""
    host = host or gethostname()
    short, _, domain = host.partition(".")
    keys: dict[str, str | Callable[[], str]] = {
        "h": host, "n": name or short, "d": domain,
        "i": _index(index, "", "0"), "I": _index(index, "-", ""),
    }
    keys.update(extra or {})
    return simple_format(s, keys)


def node_format(s: str, node: str, *, index: int = 0,
                extra: Mapping[str, str] | None = None) -> str:
    """Expand ``s`` for node ``node``: ``%n`` is the node's name, ``%h`` its host,
    ``%p`` the whole node name."""
    name, host = nodesplit(node)
    return host_format(s, host, name or NODENAME_DEFAULT, index=index,
                       extra={"p": node, **(extra or {})})


def worker_hostname(value: str | None) -> str:
    """The node name of ``-n value`` (``celeriac@<host>`` without one), as Celery's
    worker makes it: the missing parts are filled in, then the format is expanded."""
    return host_format(default_nodename(value))


def anon_nodename(hostname: str | None = None, prefix: str = "gen") -> str:
    """A node name for an unnamed node: ``gen<pid>@<host>``, as Celery's test workers
    are named."""
    return nodename(f"{prefix}{os.getpid()}", hostname or gethostname())


__all__ = ["NODENAME_DEFAULT", "NODENAME_SEP", "anon_nodename", "default_nodename",
           "gethostname", "host_format", "node_format", "nodename", "nodesplit",
           "simple_format"]


def __getattr__(name: str) -> object:
    if name == "worker_direct":
        raise ImportError("celeriac.utils.nodenames.worker_direct (Celery's direct queue of "
                          "one worker, worker_direct=True) is not provided: celeriac has no "
                          "per-worker queues; route to a queue that worker alone consumes "
                          "(-Q)", name=__name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
