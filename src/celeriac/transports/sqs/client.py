"""The AWS clients: botocore for the producer's synchronous calls, aiobotocore on the
worker's event loop; queue URLs resolved (and queues created) once per name, and AWS's
errors turned into ours."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Awaitable, Iterator
from typing import Any

from ...errors import BrokerUnavailable, ConfigurationError, MessageTooLarge, OperationalError
from .config import MAX_WAIT, SQSConfig

logger = logging.getLogger("celeriac.transports.sqs")

_MISSING = ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist")
_TOO_LARGE = ("InvalidParameterValue", "MessageTooLong", "BatchRequestTooLong")


def error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def missing(exc: BaseException) -> bool:
    return error_code(exc) in _MISSING


def translate(exc: BaseException, where: str) -> Exception:
    """Our error for one of botocore's (or the connection's)."""
    from botocore.exceptions import ClientError, NoCredentialsError

    if isinstance(exc, NoCredentialsError):
        return ConfigurationError(f"SQS ({where}): no AWS credentials: give them in the URL "
                                  "(sqs://KEY:SECRET@) or the environment")
    if isinstance(exc, ClientError):
        code = error_code(exc)
        if code in _TOO_LARGE and "too long" in str(exc).lower():
            return MessageTooLarge(f"SQS refused the message as too large ({where}): {exc}")
        return OperationalError(f"SQS {where}: {exc}")
    return BrokerUnavailable(f"SQS is unreachable ({where}): {exc}")


def _client_config(connect_timeout: float) -> Any:
    from botocore.config import Config

    # A long poll holds its request up to MAX_WAIT s: the read timeout must outlast it.
    return Config(connect_timeout=connect_timeout, read_timeout=MAX_WAIT + 10,
                  retries={"max_attempts": 3, "mode": "standard"}, max_pool_connections=50)


def queue_attributes(config: SQSConfig, name: str) -> dict[str, str]:
    """A new queue's attributes: FIFO by its name, and the visibility timeout consumers
    that do not say theirs get (Celery's workers; ours always say it)."""
    attrs = {"FifoQueue": "true"} if name.endswith(".fifo") else {}
    if config.queue_visibility is not None:
        attrs["VisibilityTimeout"] = str(config.queue_visibility)
    return attrs


_SESSIONS: dict[str, Any] = {}
_SESSION_LOCK = threading.Lock()


def _session(kind: str) -> Any:
    """One botocore (or aiobotocore) session per process: a session loads the service
    and endpoint models once (a second a client otherwise). Sessions are not thread-safe:
    clients are made under the lock."""
    if kind not in _SESSIONS:
        if kind == "aio":
            from aiobotocore.session import get_session as aio_session

            session = aio_session()
        else:
            import botocore.session

            session = botocore.session.get_session()
        # The two share one loader: the models are read once per process.
        for other in _SESSIONS.values():
            session.register_component("data_loader", other.get_component("data_loader"))
            break
        _SESSIONS[kind] = session
    return _SESSIONS[kind]


def client_kwargs(config: SQSConfig, session: Any) -> dict[str, Any]:
    kwargs = config.client_kwargs()
    if "region_name" not in kwargs:
        kwargs["region_name"] = session.get_config_variable("region") or "us-east-1"
    return kwargs


class SyncClient:
    """botocore's client (thread-safe), and queue URLs by our queue name."""

    def __init__(self, config: SQSConfig, connect_timeout: float) -> None:
        self.config = config
        self.urls: dict[str, str] = dict(config.predefined)
        self._lock = threading.Lock()
        with _SESSION_LOCK:
            session = _session("sync")
            self.client = session.create_client(
                "sqs", config=_client_config(connect_timeout),
                **client_kwargs(config, session))

    @contextlib.contextmanager
    def errors(self, where: str) -> Iterator[None]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except (BotoCoreError, ClientError) as exc:
            raise translate(exc, where) from exc

    def url(self, queue: str, *, create: bool = True) -> str | None:
        """The URL of our queue ``queue``; created when missing (unless ``create`` is
        false: then None)."""
        found = self.urls.get(queue)
        if found is not None:
            return found
        check_predefined(self.config, queue)
        name = self.config.physical(queue)
        with self.errors(f"queue {name}"):
            try:
                found = self.client.get_queue_url(QueueName=name)["QueueUrl"]
            except Exception as exc:
                if not missing(exc):
                    raise
                if not create:
                    return None
                found = self.client.create_queue(
                    QueueName=name, Attributes=queue_attributes(self.config, name))["QueueUrl"]
        with self._lock:
            self.urls[queue] = str(found)
        return str(found)

    def call(self, op: str, where: str, **kwargs: Any) -> Any:
        with self.errors(where):
            return getattr(self.client, op)(**kwargs)

    def close(self) -> None:
        self.client.close()


class AsyncClient:
    """aiobotocore's client on one event loop; opened by ``open``, closed by ``close``."""

    def __init__(self, config: SQSConfig, urls: dict[str, str], connect_timeout: float
                 ) -> None:
        self.config = config
        self.urls = urls
        self.connect_timeout = connect_timeout
        self._context: Any = None
        self.client: Any = None

    async def open(self) -> None:
        with _SESSION_LOCK:
            session = _session("aio")
            self._context = session.create_client(
                "sqs", config=_client_config(self.connect_timeout),
                **client_kwargs(self.config, session))
        self.client = await self._context.__aenter__()

    async def close(self) -> None:
        context, self._context, self.client = self._context, None, None
        if context is not None:
            await context.__aexit__(None, None, None)

    async def call(self, op: str, where: str, **kwargs: Any) -> Any:
        return await guarded(getattr(self.client, op)(**kwargs), where)

    async def url(self, queue: str) -> str:
        found = self.urls.get(queue)
        if found is not None:
            return found
        check_predefined(self.config, queue)
        name = self.config.physical(queue)
        try:
            reply = await guarded(self.client.get_queue_url(QueueName=name), f"queue {name}")
        except OperationalError as exc:
            if not missing(exc.__cause__ or exc):
                raise
            reply = await self.call("create_queue", f"queue {name}", QueueName=name,
                                    Attributes=queue_attributes(self.config, name))
        self.urls[queue] = str(reply["QueueUrl"])
        return self.urls[queue]


async def guarded(call: Awaitable[Any], where: str) -> Any:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return await call
    except (BotoCoreError, ClientError) as exc:
        raise translate(exc, where) from exc
    except OSError as exc:  # aiohttp's connection errors
        raise BrokerUnavailable(f"SQS is unreachable ({where}): {exc}") from exc


def check_predefined(config: SQSConfig, queue: str) -> None:
    if config.predefined and queue not in config.predefined:
        raise ConfigurationError(
            f"queue {queue!r} is not in broker_transport_options['predefined_queues'] "
            f"(known: {', '.join(sorted(config.predefined))}); with predefined queues "
            "celeriac creates none")


def batches(items: list[Any], size: int = 10) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


MAX_BYTES = 1_048_576
"""SQS's largest message, and largest batch: body and message attributes (1 MiB)."""


def entry_size(entry: dict[str, Any]) -> int:
    """An entry's size as SQS counts it: the body, and each attribute's name, type and
    value."""
    size = len(entry["MessageBody"].encode())
    for name, value in (entry.get("MessageAttributes") or {}).items():
        size += len(name) + len(value.get("DataType", "")) + len(
            str(value.get("StringValue", value.get("BinaryValue", ""))))
    return size


def send_batches(entries: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """``entries`` in ``SendMessageBatch`` calls: at most 10 and ``MAX_BYTES`` each,
    numbered."""
    batch: list[dict[str, Any]] = []
    size = 0
    for entry in entries:
        n = entry_size(entry)
        if batch and (len(batch) == 10 or size + n > MAX_BYTES):
            yield batch
            batch, size = [], 0
        batch.append({**entry, "Id": str(len(batch))})
        size += n
    if batch:
        yield batch

