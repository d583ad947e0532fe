"""The RabbitMQ transport (``amqp://``), in five modules:

- ``transport``: ``AMQPTransport``, the worker's consumer side (aiormq) and the interface;
- ``link``: the worker's connection on its event loop, broadcast subscriptions, reading
  dead letters;
- ``client``: the producer and administration side (pika), publisher confirms, retries,
  failover;
- ``wire``: names, queue arguments, protocol v2 headers encoding, delivery counts, delay
  routing;
- ``tolerant``: lenient pamqp decoders for bytes that are not UTF-8 where AMQP expects
  text.
"""

from .transport import AMQPTransport

__all__ = ["AMQPTransport"]
