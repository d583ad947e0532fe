"""The ``Mingle`` step (Celery's name): at startup, ask the running peers for their revoked
ids and Lamport clock (``hello``) and merge them, before this worker takes a message.

It waits at most ``worker_mingle_timeout`` seconds (1 s), and less where the broker can
say how many peers listen for commands (Redis ``PUBSUB NUMSUB``, the memory broker): it
stops at that many replies, and does not wait at all when there are none. It runs
before this worker's own ``Control`` step subscribes, so it never counts or hears
itself. ``--without-mingle`` leaves it out.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..control import gather
from ..control.mailbox import CONTROL_CHANNEL, encode_command, new_ticket
from ..transports.base import Transport, create_transport
from .blueprint import Step
from .revoked import StateDB

logger = logging.getLogger("celeriac.worker.mingle")


class Mingle(Step):
    requires = (StateDB,)

    async def start(self) -> None:
        w = self.worker
        s = w.app.settings
        if s.worker_remote_control is False:
            return  # peers cannot be asked: their control is off as ours is
        transport = create_transport(s.broker_url, s)
        started = time.monotonic()
        try:
            peers = listeners(transport)
            if peers == 0:
                logger.info("mingle: all alone")
                return
            ticket = new_ticket()
            payload = encode_command("hello", {"from_node": w.hostname}, ticket=ticket,
                                     reply=True, signing_key=s.control_signing_key)
            replies = await gather(transport, "hello", payload, ticket,
                                   s.worker_mingle_timeout, peers)
        except Exception as exc:
            logger.warning("mingle: cannot reach peers (%s: %s); starting without them",
                           type(exc).__name__, exc)
            return
        finally:
            try:
                await transport.release()
            finally:
                transport.close()
        self.merge(replies, time.monotonic() - started)

    def merge(self, replies: list[dict[str, Any]], took: float) -> None:
        w = self.worker
        revoked = w.revoked
        nodes, new = [], 0
        for one in replies:
            for node, answer in one.items():
                if node == w.hostname or not isinstance(answer, dict):
                    continue
                nodes.append(node)
                ids = answer.get("revoked")
                if isinstance(ids, dict):
                    new += revoked.update(ids)
                clock = answer.get("clock")
                if isinstance(clock, int) and w.events is not None:
                    w.events.clock.adjust(clock)
        if nodes:
            logger.info("mingle: synced with %s in %.0f ms (%d revoked id(s) new)",
                        ", ".join(sorted(nodes)), took * 1000, new)
        else:
            logger.info("mingle: no peer replied within %.0f ms", took * 1000)


def listeners(transport: Transport) -> int | None:
    """How many workers listen for commands now, where the broker can tell cheaply;
    None where it cannot (wait the timeout)."""
    conn = getattr(transport, "conn", None)
    if transport.scheme in ("redis", "rediss") and conn is not None:
        try:
            reply = conn.command(lambda ns: ("PUBSUB", "NUMSUB", f"{ns}:bc:{CONTROL_CHANNEL}"))
            return int(reply[1])
        except Exception:  # ACLs may refuse PUBSUB: ask and wait instead
            return None
    broker = getattr(transport, "broker", None)
    subscribers = getattr(broker, "subscribers", None)
    if transport.scheme == "memory" and isinstance(subscribers, dict):
        return len(subscribers.get(CONTROL_CHANNEL, ()))
    return None
