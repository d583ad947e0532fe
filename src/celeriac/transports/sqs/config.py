"""What an ``sqs://`` URL and ``broker_transport_options`` say: credentials, endpoint,
region, queue names, timings.

The URL forms are Celery's (kombu's SQS transport): ``sqs://`` (boto's credential chain:
environment, profile, instance role), ``sqs://KEY:SECRET@`` (URL-quoted), and
``sqs://KEY:SECRET@host:port`` for a local endpoint (moto, ElasticMQ; ``http`` only when
``is_secure`` is false, as kombu). Our own ``endpoint_url`` option names the endpoint
whole. Options are read from ``broker_transport_options`` and, as for every celeriac URL,
from the URL's query (the query wins): kombu's names ``region``, ``queue_name_prefix``,
``predefined_queues``, ``visibility_timeout``, ``wait_time_seconds``, ``polling_interval``,
``is_secure``; ours ``endpoint_url``, ``namespace``, ``dead_letter_queue``, ``fifo_group``
and ``fanout_url``.
"""

from __future__ import annotations

import math
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ...errors import ConfigurationError

if TYPE_CHECKING:
    from ...settings import Settings

MAX_DELAY = 900
"""SQS's longest ``DelaySeconds``: longer delays go in hops of at most this."""
MAX_VISIBILITY = 43200
MAX_WAIT = 20
"""SQS's longest long poll (``WaitTimeSeconds``)."""
DEAD_QUEUE = "celeriac-dead"
FIFO_GROUPS = ("queue", "task", "id")

# kombu's rule for queue names, so Celery and celeriac name a queue alike: "." becomes
# "-" (but a ".fifo" suffix stays), other punctuation but "-" and "_" becomes "_".
_REPLACE = {ord(c): ord("_") for c in string.punctuation if c not in "-_."}
_REPLACE[ord(".")] = ord("-")


DELAYED = "-delayed"


def companion(queue: str) -> str:
    """Where the delayed messages of the FIFO queue ``queue`` wait: a standard queue
    (``jobs.fifo`` -> ``jobs.fifo-delayed``, SQS name ``jobs-fifo-delayed``), since FIFO
    queues have no per-message delay; a consumer of ``queue`` moves them over when due."""
    return queue + DELAYED


def queue_name(prefix: str, name: str) -> str:
    """The SQS queue name of our queue ``name`` (kombu's ``entity_name``)."""
    full = prefix + name
    if full.endswith(".fifo"):
        return full[:-5].translate(_REPLACE) + ".fifo"
    return full.translate(_REPLACE)


@dataclass(frozen=True)
class SQSConfig:
    region: str | None = None
    """None: boto's (``AWS_REGION``, ``AWS_DEFAULT_REGION``, the profile), else
    ``us-east-1`` as kombu."""
    access_key: str | None = None
    secret_key: str | None = None
    endpoint_url: str | None = None
    prefix: str = ""
    """``queue_name_prefix`` followed by the ``namespace`` (with a "-")."""
    predefined: Mapping[str, str] = field(default_factory=dict)
    """Our queue name -> its SQS queue URL; when given, only these queues are used."""
    visibility_timeout: int = 10
    wait_time_seconds: int = 10
    polling_interval: float = 0.0
    dead_letter_queue: str = DEAD_QUEUE
    fifo_group: str = "queue"
    fanout_url: str | None = None
    queue_visibility: int | None = None
    """The ``VisibilityTimeout`` attribute of the queues it creates: ``visibility_timeout``
    when given (kombu's rule), else SQS's default (kombu's layout: kombu's 1800 s)."""

    def physical(self, name: str) -> str:
        return queue_name(self.prefix, name)

    def client_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"region_name": self.region} if self.region else {}
        if self.endpoint_url:
            kwargs["endpoint_url"] = self.endpoint_url
        if self.access_key is not None:
            kwargs["aws_access_key_id"] = self.access_key
            kwargs["aws_secret_access_key"] = self.secret_key or ""
        return kwargs


def parse(url: str, settings: Settings) -> SQSConfig:
    """The configuration ``url`` and ``settings.broker_transport_options`` give."""
    parts = urlsplit(url.strip())
    opts: dict[str, Any] = dict(settings.broker_transport_options or {})
    opts.update(parse_qsl(parts.query, keep_blank_values=True))
    opts.pop("layout", None)
    secure = _flag(opts.get("is_secure", True), "is_secure")
    endpoint = opts.get("endpoint_url") or None
    if endpoint is None and parts.hostname:
        port = f":{parts.port}" if parts.port else ""
        endpoint = f"{'https' if secure else 'http'}://{parts.hostname}{port}"
    namespace = str(opts.get("namespace") or "")
    prefix = str(opts.get("queue_name_prefix") or "") + (f"{namespace}-" if namespace else "")
    lease = math.ceil(settings.worker_lease_timeout)
    visibility = _int(opts.get("visibility_timeout", lease), "visibility_timeout", 1,
                      MAX_VISIBILITY)
    fanout = opts.get("fanout_url") or _store_url(settings.result_backend)
    return SQSConfig(
        region=str(opts["region"]) if opts.get("region") else None,
        access_key=unquote(parts.username) if parts.username else None,
        secret_key=unquote(parts.password) if parts.password else None,
        endpoint_url=endpoint,
        prefix=prefix,
        predefined=_predefined(opts.get("predefined_queues")),
        visibility_timeout=visibility,
        wait_time_seconds=_int(opts.get("wait_time_seconds", 10), "wait_time_seconds",
                               0, MAX_WAIT),
        polling_interval=_seconds(opts.get("polling_interval", 0.0), "polling_interval"),
        dead_letter_queue=str(opts.get("dead_letter_queue") or DEAD_QUEUE),
        fifo_group=_choice(opts.get("fifo_group", "queue"), "fifo_group", FIFO_GROUPS),
        fanout_url=str(fanout) if fanout else None,
        queue_visibility=visibility if "visibility_timeout" in opts else None,
    )


def _store_url(url: str | None) -> str | None:
    """The result backend's URL when broadcasts can go through it (Redis pub/sub,
    PostgreSQL's NOTIFY)."""
    if not url:
        return None
    first = url.split(";")[0].strip()
    scheme = urlsplit(first).scheme
    return first if scheme in ("redis", "rediss", "postgres", "postgresql") else None


def _predefined(raw: object) -> dict[str, str]:
    if raw in (None, ""):
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigurationError("broker_transport_options['predefined_queues'] must map "
                                 f"queue names to {{'url': ...}}, got {raw!r}")
    out: dict[str, str] = {}
    for name, spec in raw.items():
        queue_url = spec.get("url") if isinstance(spec, Mapping) else None
        if not isinstance(queue_url, str) or not queue_url:
            raise ConfigurationError(f"predefined_queues[{name!r}] needs a 'url', got {spec!r}")
        out[str(name)] = queue_url
    return out


def _int(raw: object, name: str, low: int, high: int) -> int:
    try:
        value = math.ceil(float(raw))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigurationError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not low <= value <= high:
        raise ConfigurationError(f"{name} must be between {low} and {high} s on SQS, "
                                 f"got {raw!r}")
    return value


def _seconds(raw: object, name: str) -> float:
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigurationError(f"{name} must be a number of seconds, got {raw!r}") from None
    if value < 0:
        raise ConfigurationError(f"{name} must be >= 0, got {raw!r}")
    return value


def _flag(raw: object, name: str) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"{name} must be true or false, got {raw!r}")


def _choice(raw: object, name: str, known: tuple[str, ...]) -> str:
    if raw not in known:
        raise ConfigurationError(f"{name} must be one of {', '.join(known)}; got {raw!r}")
    return str(raw)
