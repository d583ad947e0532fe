"""moto's SQS server with two fixes, for the tests and the bench (never for users):
``python scripts/moto_sqs.py -H 127.0.0.1 -p PORT``.

moto reads the clock through datetime objects for every message of a queue on every call
(22 us each): a queue of 500 took seconds a call; the plain clock instead. And its
receive checks and marks a message visible-then-received without a lock, so two server
threads could hand one message to two consumers at once: each receive runs under its
queue's lock (which its long poll's wait releases, so a waiting poll blocks nobody).
"""

import functools
import sys
import time

import moto.sqs.models as models
from moto.server import main

models.unix_time = lambda dt=None: time.time()
models.unix_time_millis = lambda dt=None: time.time() * 1000.0
_receive = models.SQSBackend.receive_message


@functools.wraps(_receive)
def _locked(self, queue_name, *args, **kwargs):  # type: ignore[no-untyped-def]
    with self.get_queue(queue_name)._messages_lock:
        return _receive(self, queue_name, *args, **kwargs)


models.SQSBackend.receive_message = _locked

if __name__ == "__main__":
    main(sys.argv[1:])
