"""The ``Mingle`` step (Celery's name): at startup, ask the running peers for their revoked
ids and Lamport clock (``hello``) and merge them, before this worker takes a message.

It waits at most ``worker_mingle_timeout`` seconds (1 s), and less where the broker can
say how many peers there are (``listeners``): it stops at that many replies, and does
not wait at all when there are none. A peer starting in the same moment may not be
counted yet; what it knows of revokes is in the shared store anyway. It runs before
this worker's own ``ControlStep`` subscribes, so it never counts or hears itself.
``--without-mingle`` leaves it out.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..compat.pidbox import reply_exchange_for
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
            peers = listeners(transport, w.queues)
            if peers == 0:
                logger.info("mingle: all alone")
                return
            ticket = new_ticket()
            payload = encode_command("hello", {"from_node": w.hostname}, ticket=ticket,
                                     reply=True, signing_key=s.control_signing_key,
                                     reply_exchange=reply_exchange_for(s.broker_url))
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
                if isinstance(ids, list):  # a Celery 5.7 worker's hello: the ids only
                    until = time.time() + w.app.settings.worker_revoke_expires
                    ids = {i: until for i in ids if isinstance(i, str)}
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


def listeners(transport: Transport, queues: list[str]) -> int | None:
    """How many peers may answer now, where the broker can tell cheaply (0: start at
    once); None where it cannot (wait the timeout). Redis counts the subscribers of the
    control channel of its database and namespace exactly (a Cluster cannot); SQLite the
    consumers holding a lease; RabbitMQ the consumers of this worker's queues (peers on
    other queues only shorten the wait when they answer); memory its subscribers."""
    try:
        # Redis's, both layouts: the transport alone knows its channel's name (database
        # and namespace in it, or kombu's), so it counts.
        counter = getattr(transport, "control_listeners", None)
        if counter is not None:
            return counter()  # type: ignore[no-any-return]
        if transport.scheme == "sqlite":
            rows = transport.db.read(  # type: ignore[attr-defined]
                "SELECT count(*) FROM consumers WHERE expires > ?", (time.time(),))
            return int(rows[0][0])
        if transport.scheme in ("amqp", "amqps"):
            return sum(_amqp_consumers(transport, q) for q in queues)
        if transport.scheme == "memory":
            subscribers = transport.broker.subscribers  # type: ignore[attr-defined]
            return len(subscribers.get(CONTROL_CHANNEL, ()))
    except Exception as exc:  # ACLs may refuse PUBSUB, a queue may not exist: just wait
        logger.debug("mingle: cannot count peers (%s)", exc)
    return None


def _amqp_consumers(transport: Any, queue: str) -> int:
    import pika  # deferred: the amqp extra is optional

    name = transport.config.queue(queue)

    def op(link: Any) -> int:
        try:
            return int(link.admin().queue_declare(name, passive=True).method.consumer_count)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code == 404:  # no such queue yet: nobody consumes it
                return 0
            raise

    count: int = transport.client.call("count consumers", op, retry=False)
    return count
