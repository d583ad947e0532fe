"""``SendOptions``: every ``apply_async`` option of one send, built once where the call
comes in (``Task.apply_async``, ``Celeriac.send_task``/``send_many``, a signature, a
worker's follow-up) and passed unchanged to ``build``/``prepare``.

Nothing here imports the rest of celeriac but ``errors``: ``tasks.py`` imports this
module while it is itself being imported."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any

SEND_OPTIONS = frozenset({
    "shadow", "routing_key", "exchange", "retry", "retry_policy", "parent_id", "root_id",
    "group_id", "add_to_parent", "link", "link_error", "compression", "argsrepr",
    "kwargsrepr", "app_id", "fair_key", "reply_to"})
"""``Task.apply_async``'s options beyond its named parameters (Celery's names), passed
through as they are; any other raises ``TypeError`` naming it."""

EMPTY_EMBED: dict[str, Any] = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
"""A message body's embed when nothing follows the task (protocol v2)."""


@dataclass(frozen=True, slots=True)
class SendOptions:
    """The options of one send, Celery's ``apply_async`` names (``link``/``link_error``
    become the ``embed``'s ``callbacks``/``errbacks``). ``check()`` validates the
    values a caller gave; a worker's follow-ups build one without it (their policy:
    send what a signature holds, as it arrived)."""

    countdown: float | None = None
    eta: datetime | None = None
    expires: float | timedelta | datetime | None = None
    queue: str | None = None
    routing_key: str | None = None
    exchange: Any = None
    """None, the default one (``""``), or one a declared queue is bound to."""
    priority: int | None = None
    task_id: str | None = None
    headers: Mapping[str, Any] | None = None
    serializer: str | None = None
    compression: str | None = None
    retries: int = 0
    time_limit: float | None = None
    soft_time_limit: float | None = None
    ignore_result: bool = False
    shadow: str | None = None
    parent_id: str | None = None
    root_id: str | None = None
    group_id: str | None = None
    group_index: int | None = None
    add_to_parent: bool = True
    """Take ``parent_id``/``root_id`` from the task running here, and record the send
    among its children."""
    retry: bool | None = None
    retry_policy: Mapping[str, Any] | None = None
    argsrepr: str | None = None
    """The ``argsrepr`` header logs and monitors show instead of the arguments' repr
    (Celery's: hide a secret argument); None: the repr."""
    kwargsrepr: str | None = None
    fair_key: str | None = None
    """The message's key on a fair queue (``broker_fair_queues``: consumers take keys in
    turn); ``producer/flow.py`` puts it in the ``celeriac_fair`` header."""
    app_id: str | None = None
    """The message's ``app_id`` property (AMQP's; the task sees it in
    ``self.request.properties``)."""
    reply_to: str | None = None
    """The message's ``reply_to`` property: where rpc:// replies go (Celery's frozen
    signatures carry it, so a chain's later steps reply to its caller); None: the
    result backend's own (``RPCBackend.reply_to``), or none."""
    embed: Mapping[str, Any] | None = None
    """What follows the task (``callbacks``, ``errbacks``, ``chain``, ``chord``): merged
    over ``EMPTY_EMBED`` into the body, which is encoded once."""

    def check(self) -> SendOptions:
        """Refuse a bad value, naming its parameter (``TypeError``/``ValueError``)."""
        priority = self.priority
        if priority is not None and (not isinstance(priority, int)
                                     or not 0 <= priority <= 9):
            raise ValueError(f"priority must be an int from 0 to 9, got {priority!r}")
        countdown, eta = self.countdown, self.eta
        if countdown is not None:
            if eta is not None:
                raise ValueError("give countdown or eta, not both")
            if not isinstance(countdown, (int, float)):
                raise TypeError(f"countdown must be a number of seconds, got {countdown!r}")
        elif eta is not None and not isinstance(eta, datetime):
            raise TypeError(f"eta must be a datetime, got {eta!r}")
        expires = self.expires
        if expires is not None and not isinstance(expires, (int, float, timedelta, datetime)):
            raise TypeError(f"expires must be seconds, a timedelta or a datetime, got "
                            f"{expires!r}")
        if self.reply_to is not None and not isinstance(self.reply_to, str):
            raise TypeError(f"reply_to must be a queue name, got {self.reply_to!r}")
        soft, hard = self.soft_time_limit, self.time_limit
        if soft and hard and soft > hard:
            # Celery's check: the soft limit is the task's warning before the hard one.
            raise ValueError(f"soft_time_limit must be less than or equal to time_limit, "
                             f"got soft_time_limit={soft!r}, time_limit={hard!r}")
        return self

    @classmethod
    def from_mapping(cls, where: str, options: Mapping[str, Any],
                     embed: Mapping[str, Any] | None = None) -> SendOptions:
        """Options given as a dict (a signature's), checked; an unknown one is a
        ``TypeError`` naming it, as a keyword ``where()`` does not take."""
        unknown = options.keys() - NAMES
        if unknown:
            raise TypeError(f"{where}() got an unexpected keyword argument "
                            f"{', '.join(repr(u) for u in sorted(unknown))}")
        return cls(**options, embed=embed or None).check()


NAMES = frozenset(f.name for f in fields(SendOptions)) - {"embed"}
"""The option names a dict of options (a signature's) may hold."""

DEFAULT = SendOptions()
"""No options: ``send_task(name)``'s."""
