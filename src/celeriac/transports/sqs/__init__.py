"""The Amazon SQS broker (``sqs://``, ``pip install 'celeriac[sqs]'``): ``transport``
(leases as visibility timeouts, delays in hops, the dead-letter queue in ``admin``),
over the AWS clients of ``client``; broadcasts through the shared store's Redis
(``fanout``)."""

from .transport import SQSTransport

__all__ = ["SQSTransport"]
