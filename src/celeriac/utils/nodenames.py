"""Celery's ``celery.utils.nodenames``: node names (``name@host``) and their ``%h``
format. The code lives in ``celeriac.cli.nodenames`` (what ``-n``, ``--logfile`` and
``--pidfile`` expand); this module adds Celery's ``anon_nodename``."""

from __future__ import annotations

import os

from ..cli.nodenames import (
    NODENAME_DEFAULT,
    NODENAME_SEP,
    default_nodename,
    gethostname,
    host_format,
    node_format,
    nodename,
    nodesplit,
    simple_format,
)


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
