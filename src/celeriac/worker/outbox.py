"""``OutboxStep``: an outbox relay inside the worker (``worker_outbox=True``).

The relay (``producer/outbox_relay.py``) runs in a thread of the worker's parent: its
PostgreSQL client and its publishes are blocking calls, and while the broker is down it
backs off for seconds, which must not stall the loop that renews leases and acks. It
publishes through the app's transport (whose producer side is thread-safe) and starts
after the consumer, so the pool's first children are forked before it has connections.
A relay that raises what it does not expect (a bug) stops the worker with exit code 1,
as a dead pump would: a worker must not go on with its relay silently gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

from ..producer.outbox_relay import Relay
from .blueprint import Step
from .steps import ConsumerStep

logger = logging.getLogger("celeriac.worker.outbox")

JOIN_TIMEOUT = 10.0
"""Seconds a stopping worker waits for the relay's step in hand (a publish, a delete)."""


class OutboxStep(Step):
    """Drains ``outbox_url``'s outbox to the broker while the worker runs."""

    requires = (ConsumerStep,)

    async def start(self) -> None:
        w = self.worker
        self.relay = Relay(w.app)
        loop = asyncio.get_running_loop()

        def run() -> None:
            try:
                self.relay.run()
            except BaseException as exc:
                logger.critical("outbox relay died (%s: %s); the worker stops",
                                type(exc).__name__, exc, exc_info=True)
                with contextlib.suppress(RuntimeError):  # the loop already closed
                    loop.call_soon_threadsafe(w.fail, f"outbox relay died: {exc}")

        self.thread = threading.Thread(target=run, name="celeriac-outbox-relay", daemon=True)
        self.thread.start()

    async def stop(self) -> None:
        self.relay.stop()
        await asyncio.to_thread(self.thread.join, JOIN_TIMEOUT)
        if self.thread.is_alive():
            logger.warning("outbox relay did not stop within %gs; its rows stay locked "
                           "until the process exits, then another relay takes them",
                           JOIN_TIMEOUT)
        else:
            logger.info("outbox relay stopped: %d message(s) published",
                        self.relay.published)
