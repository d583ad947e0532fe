"""The transport interface every broker implements, and the URL -> transport registry.

Producers use the synchronous methods (``publish``, ``publish_many``, admin calls) from
ordinary code and threads. The worker's main process uses the ``async`` methods on its
event loop. Semantics every transport keeps (and ``tests/contracts`` checks):

- ``fetch`` hands a message to one consumer at a time; until that consumer acks,
  rejects or dead-letters it, the message is owned by the consumer.
- A consumer that stops renewing its lease (``renew_lease``) for ``worker_lease_timeout`` is
  dead: any live consumer's renewal returns the dead one's messages to their queues, and their
  ``delivery_count`` grows by one on the next delivery. A long task on a live consumer is
  never handed out twice.
- ``publish(..., delay=s)`` stores the message in the broker until it is due.
- Priorities 0-9, higher first; FIFO within a priority.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from ..clients.schemes import SchemeRegistry
from ..errors import ConfigurationError, MessageTooLarge
from ..protocol import Delivery, Message

if TYPE_CHECKING:
    from ..backends.base import ResultBackend, Stored
    from ..settings import Settings


@dataclass(frozen=True, slots=True)
class DeadLetter:
    id: int | str
    queue: str
    reason: str
    message: Message
    delivery_count: int
    dead_at: float


@dataclass(frozen=True, slots=True)
class Outgoing:
    queue: str
    message: Message
    delay: float | None = None
    fanout: bool = False
    """``queue`` names a fanout group: a copy goes to every queue bound to it
    (``Transport.bind_fanout``), now (an eta stays in the headers)."""


class Publisher(abc.ABC):
    """The producer's side of a broker: what ``send_task`` needs, and nothing else.
    Every ``Transport`` is one; a pool child whose broker lives in the worker's memory
    has only this (``worker/pool/child.py`` ``RelayPublisher``)."""

    fanout: ClassVar[bool] = False
    """Whether ``publish_many`` takes ``Outgoing(fanout=True)`` (fanout groups)."""

    def __init__(self, url: str, settings: Settings) -> None:
        self.url = url
        self.settings = settings

    # -- producer side (synchronous, thread-safe) ---------------------------------------
    def publish(self, queue: str, message: Message, *, delay: float | None = None) -> None:
        self.publish_many([Outgoing(queue, message, delay)])

    @abc.abstractmethod
    def publish_many(self, items: Sequence[Outgoing]) -> None:
        """Publish all items; on return every one of them is durable in the broker."""

    def check_size(self, message: Message) -> None:
        size = len(message.body)
        if size > self.settings.max_message_size:
            raise MessageTooLarge(
                f"message for task {message.headers.get('task')!r} is {size} bytes, over "
                f"max_message_size={self.settings.max_message_size}; nothing was published"
            )

    def close(self) -> None:
        """Release connections held by this process."""


class Transport(Publisher):
    """A broker: publishing, consuming with leases, dead letters, administration and
    broadcast. One module per broker; ``tests/contracts`` holds every one to this."""

    scheme: ClassVar[str]
    process_local: ClassVar[bool] = False
    """True when the broker lives in one process's memory (pool children relay to it)."""

    def __init__(self, url: str, settings: Settings) -> None:
        super().__init__(url, settings)
        self.consumer_id: str | None = None

    # -- consumer side (the worker's event loop) ----------------------------------------
    async def connect(self, consumer_id: str) -> None:
        """Register as a consumer; its lease starts now."""
        self.consumer_id = consumer_id

    @abc.abstractmethod
    async def fetch(self, queues: Sequence[str], limit: int, timeout: float) -> list[Delivery]:
        """Up to ``limit`` messages from ``queues``; waits up to ``timeout`` s for the first."""

    @abc.abstractmethod
    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        """Forget these messages: they were handled."""

    @abc.abstractmethod
    async def requeue(self, deliveries: Sequence[Delivery], *, redelivered: bool,
                      delay: float = 0.0) -> None:
        """Return messages to their queues. ``redelivered=False`` gives back messages that
        were never started, so the delivery does not count against ``task_max_deliveries``.
        With ``delay`` (seconds) they wait in the delay store first (a lost delivery's
        backoff)."""

    @abc.abstractmethod
    async def dead_letter(self, delivery: Delivery, reason: str) -> None:
        """Move a message to the dead-letter store with the reason."""

    # -- the worker's hot path: one broker call per turn of the consumer's pump ----------
    def results_namespace(self, backend: ResultBackend) -> str | None:
        """Where ``settle_and_fetch`` can store ``backend``'s results in the same broker call (the
        backend keeps them on this broker's server); None: the caller stores them."""
        return None

    def direct_settle(self, backend: ResultBackend) -> tuple[str, ...] | None:
        """What a pool child needs, with a message's tag, to store its task's result and
        ack the message itself (``settle_here``) on an idle worker; None (the default):
        only the worker settles."""
        return None

    def settle_here(self, settle: Sequence[str], stored: Stored | None) -> None:
        """In a pool child: store ``stored`` and ack the message ``settle`` names (from
        ``direct_settle``), in one attempt; raises if it may not have run (the worker then
        settles as usual). Only transports whose ``direct_settle`` answers have it."""
        raise NotImplementedError(f"{type(self).__name__} settles in the worker only")

    def settled_elsewhere(self, deliveries: Sequence[Delivery]) -> None:
        """``deliveries`` were settled by a pool child (``settle_here``): forget them."""

    async def settle_and_fetch(self, acks: Sequence[Delivery], results: Sequence[Stored],
                       results_namespace: str | None, queues: Sequence[str], limit: int
                       ) -> list[Delivery]:
        """Store ``results`` (only given with a ``results_namespace``), ack ``acks``, then
        fetch up to ``limit`` messages from ``queues`` without waiting: one broker call
        where the broker has one (Redis). The default acks, then fetches."""
        if results:
            raise ValueError(f"{type(self).__name__} cannot store results itself")
        if acks:
            await self.ack(acks)
        return await self.fetch(queues, limit, 0.0) if limit > 0 else []

    async def wait_ready(self, queues: Sequence[str], limit: int, timeout: float
                         ) -> list[Delivery] | None:
        """After a ``settle_and_fetch`` fetched fewer than it asked for: wait up to ``timeout``
        seconds for messages. Returns what it fetched meanwhile, or None when it only
        waited (something may be ready: the next ``settle_and_fetch`` fetches it). The default
        is a blocking fetch."""
        return await self.fetch(queues, limit, timeout)

    async def bind_fanout(self, group: str, queue: str) -> None:
        """Bind this consumer's ``queue`` to the fanout ``group``: from now on every
        message published to the group gets a copy in it. Lasts while the consumer's
        lease does (Redis) or its connection (RabbitMQ: an auto-delete queue)."""
        raise ConfigurationError(f"{type(self).__name__} has no fanout queues (queue "
                                 f"{group!r}): use a Redis or RabbitMQ broker")

    @abc.abstractmethod
    async def renew_lease(self) -> int:
        """Renew this consumer's lease; return the count of dead consumers' messages
        returned to their queues."""

    async def disconnect(self) -> None:
        """Stop consuming. Messages still owned return to their queues uncounted; then
        ``release``."""
        await self.release()

    async def release(self) -> None:
        """Close the connections this event loop holds, giving nothing back: what a
        crash leaves behind (owned messages return when the lease expires, or on AMQP
        when the broker sees the connection close). Call it before the loop ends."""

    # -- administration (synchronous) ---------------------------------------------------
    def ping(self) -> None:
        """Raise ``BrokerUnavailable`` unless the broker answers."""
        self.queue_length(self.settings.task_default_queue)

    @abc.abstractmethod
    def queue_length(self, queue: str) -> int:
        """Messages ready in ``queue`` (not delayed, not owned)."""

    @abc.abstractmethod
    def purge(self, queue: str) -> int:
        """Delete ready and delayed messages of ``queue``; returns how many."""

    @abc.abstractmethod
    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """The oldest dead letters first."""

    @abc.abstractmethod
    def requeue_dead(self, ids: Sequence[int | str]) -> int:
        """Put these dead letters back on their original queues as new deliveries
        (delivery count reset); returns how many were found and moved."""

    @abc.abstractmethod
    def purge_dead(self, ids: Sequence[int | str] | None = None) -> int:
        """Delete these dead letters (all if ``ids`` is None); returns how many."""

    # -- broadcast (events and control) ---------------------------------------------------
    @abc.abstractmethod
    def broadcast(self, channel: str, payload: bytes, routing_key: str = "") -> None:
        """Send ``payload`` to every current subscriber of ``channel``; not stored.

        ``routing_key`` labels it where the broker routes by key (AMQP); others ignore it."""

    def has_subscribers(self, channel: str) -> bool:
        """False only where the broker can tell that nobody would receive a broadcast on
        ``channel`` now (it would drop it), so a sender may skip making and sending it."""
        return True

    @abc.abstractmethod
    async def subscribe(self, channel: str) -> Subscription:
        """Start receiving what is broadcast on ``channel`` from now on."""


PRIVATE_PREFIX = "celeriac.reply."
"""A broadcast channel named with this prefix has one subscriber, the caller that named
it (a remote-control call's reply channel, ``control/mailbox.py``): a transport may route
it as a key of one shared exchange (AMQP) and drop what is left of it when that
subscriber closes (memory, SQLite), so a call leaves nothing behind."""
CONTROL_CHANNEL = "celeriac.control"
"""Where remote-control commands are broadcast (every worker subscribes;
``control/mailbox.py``)."""
REPLY_EXCHANGE = "celeriac.reply"
"""The exchange a control call's replies go through (``control/mailbox.py``)."""
EVENTS_CHANNEL = "celeriac.events"
"""Where events are broadcast (``events/dispatcher.py``).

The broadcast channels' names live here, below the services that use them, because a
transport (Redis's subscriber count) and compatibility mode (Celery's exchanges) route
them too."""


class Subscription(abc.ABC):
    """What ``Transport.subscribe`` returns: payloads in the order each sender sent them."""

    @abc.abstractmethod
    async def get(self, timeout: float) -> bytes | None:
        """The next payload, or None after ``timeout`` seconds without one."""

    @abc.abstractmethod
    async def close(self) -> None: ...


TRANSPORTS: SchemeRegistry[Transport] = SchemeRegistry("broker", "transport", {
    "memory": ("celeriac.transports.memory", "MemoryTransport"),
    "sqlite": ("celeriac.transports.sqlite", "SQLiteTransport"),
    "redis": ("celeriac.transports.redis", "RedisTransport"),
    "rediss": ("celeriac.transports.redis", "RedisTransport"),
    "redis+sentinel": ("celeriac.transports.redis", "RedisTransport"),
    "sentinel": ("celeriac.transports.redis", "RedisTransport"),
    "redis+cluster": ("celeriac.transports.redis_cluster", "RedisClusterTransport"),
    "amqp": ("celeriac.transports.amqp", "AMQPTransport"),
    "amqps": ("celeriac.transports.amqp", "AMQPTransport"),
    "sqs": ("celeriac.transports.sqs", "SQSTransport"),
}, layouts={
    # Compatibility mode: kombu's Redis layout, and RabbitMQ queues declared exactly as
    # Celery declares them, events and remote control on Celery's exchanges.
    ("redis", "kombu"): ("celeriac.compat.redis_broker", "KombuRedisTransport"),
    ("rediss", "kombu"): ("celeriac.compat.redis_broker", "KombuRedisTransport"),
    ("amqp", "kombu"): ("celeriac.compat.amqp_broker", "KombuAMQPTransport"),
    ("amqps", "kombu"): ("celeriac.compat.amqp_broker", "KombuAMQPTransport"),
    ("sqs", "kombu"): ("celeriac.compat.sqs_broker", "KombuSQSTransport"),
})


def register(scheme: str, factory: type[Transport]) -> None:
    """Add a transport for ``scheme://`` URLs (third-party transports)."""
    TRANSPORTS.register(scheme, factory)


def known_schemes() -> list[str]:
    return TRANSPORTS.known()


def transport_class(url: str) -> type[Transport]:
    """The transport class for ``url`` (the first of several ``;``-separated URLs)."""
    first = url.split(";")[0].strip()
    return TRANSPORTS.lookup(first)


def create_transport(url: str, settings: Settings) -> Transport:
    """The transport for ``url``; a transport that supports failover reads every
    ``;``-separated URL from ``settings.broker_url`` itself."""
    return transport_class(url)(url.split(";")[0].strip(), settings)
