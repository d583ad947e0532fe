"""``BeatStore``: where beats keep what they share, and which store an app uses.

A store holds, for one app (one key namespace / table prefix):

- the **lease**: which beat leads (its holder id) and until when; ``acquire`` takes it
  when it is free or lapsed and renews it for its holder, atomically;
- the **entries** (JSON, ``BeatEntry.to_json``) and each entry's **last due time**
  (integer milliseconds since the epoch);
- the **run keys** (``<entry>@<due ms>``): ``claim`` records one only if, in one atomic
  step, the caller still holds the lease, the due time is later than the entry's last
  one, and the key is new; it then moves the last due time to it. A beat sends a run
  only after its claim succeeded, so a leader that was paused past its lease (and
  replaced) is refused for every run, and no due time is ever claimed twice, even by
  two beats that both believe they lead. Run keys are kept ``RUN_KEY_TTL`` as a ledger;
  the monotonic last due time is what refuses a repeat after that.

Chosen from the settings (``open_store``): the result backend's URL if it is Redis,
PostgreSQL, SQLite or memory, else the broker's; on RabbitMQ with such a backend, the
backend's. Otherwise there is no shared store and ``ConfigurationError`` says what to set.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from .._net import mask_password
from ..errors import ConfigurationError

if TYPE_CHECKING:
    from ..settings import Settings

RUN_KEY_TTL = 7 * 86400
"""Seconds a run key is kept (the ledger of sends)."""
LEDGER_LENGTH = 10_000
"""Run keys ``runs()`` can list, newest first."""

STORES = {
    "memory": "celeriac.beat.stores.memory:MemoryStore",
    "redis": "celeriac.beat.stores.redis:RedisStore",
    "rediss": "celeriac.beat.stores.redis:RedisStore",
    "postgresql": "celeriac.beat.stores.postgres:PostgresStore",
    "postgres": "celeriac.beat.stores.postgres:PostgresStore",
    "sqlite": "celeriac.beat.stores.sqlite:SQLiteStore",
}


@dataclass(frozen=True, slots=True)
class Lease:
    holder: str
    expires: float
    """Unix time (the store's clock, where it has one)."""


@dataclass(frozen=True, slots=True)
class Run:
    """A claimed run: entry ``name`` at due time ``due_ms``, claimed by ``holder``."""

    name: str
    due_ms: int
    holder: str

    @property
    def key(self) -> str:
        return run_key(self.name, self.due_ms)


def run_key(name: str, due_ms: int) -> str:
    return f"{name}@{due_ms}"


def parse_run_key(key: str) -> tuple[str, int]:
    name, _, due = key.rpartition("@")
    return name, int(due)


class BeatStore(ABC):
    """The operations beats share; every one is atomic in the store."""

    def __init__(self, url: str, settings: Settings) -> None:
        self.url = url
        self.safe_url = mask_password(url)
        self.settings = settings

    # -- the lease ----------------------------------------------------------------------
    @abstractmethod
    def acquire(self, holder: str, ttl: float) -> bool:
        """Take the lease if it is free or lapsed, or renew it if ``holder`` has it, for
        ``ttl`` seconds; True if ``holder`` holds it now."""

    @abstractmethod
    def release(self, holder: str) -> None:
        """Give the lease up if ``holder`` has it (a stopping beat: no wait for a lapse)."""

    @abstractmethod
    def leader(self) -> Lease | None:
        """Who holds the lease now, if anyone."""

    # -- runs ---------------------------------------------------------------------------
    @abstractmethod
    def claim(self, holder: str, name: str, due_ms: int) -> bool:
        """Record run ``name@due_ms`` if ``holder`` holds the lease, ``due_ms`` is later
        than the entry's last due time and the run key is new; then make ``due_ms`` the
        last due time. True: the caller (alone) may send it."""

    @abstractmethod
    def advance(self, holder: str, name: str, due_ms: int) -> bool:
        """Move the entry's last due time to ``due_ms`` without a run (windows skipped, a
        new entry's starting point), under the same conditions as ``claim``."""

    @abstractmethod
    def last_runs(self) -> dict[str, int]:
        """Each entry's last due time (ms)."""

    @abstractmethod
    def runs(self, limit: int = LEDGER_LENGTH) -> list[Run]:
        """The latest claimed runs, newest first."""

    # -- entries ------------------------------------------------------------------------
    @abstractmethod
    def entries(self) -> dict[str, bytes]:
        """Every entry's JSON by name."""

    @abstractmethod
    def put_entry(self, name: str, data: bytes) -> None:
        """Add or replace an entry (its last due time is kept)."""

    @abstractmethod
    def remove_entry(self, name: str) -> bool:
        """Delete an entry and its last due time; False if there was none."""

    def close(self) -> None:
        """Release connections."""


def store_url(settings: Settings) -> str:
    """The URL of the store beats use with these settings (see the module doc)."""
    candidates = [settings.result_backend, settings.broker_url.split(";")[0]]
    for url in candidates:
        if url and urlsplit(url.strip()).scheme in STORES:
            return url.strip()
    raise ConfigurationError(
        "beat needs a shared store for its schedule state and lease: set result_backend "
        "(or broker_url) to a redis://, postgresql:// or sqlite:// URL; "
        f"broker_url={mask_password(settings.broker_url)!r} and "
        f"result_backend={mask_password(settings.result_backend or '')!r} cannot hold it")


def open_store(settings: Settings, url: str | None = None) -> BeatStore:
    url = url or store_url(settings)
    scheme = urlsplit(url).scheme
    if scheme not in STORES:
        raise ConfigurationError(f"beat store URL {mask_password(url)!r}: scheme "
                                 f"{scheme!r} is not one of {', '.join(sorted(STORES))}")
    module, _, cls = STORES[scheme].partition(":")
    store: BeatStore = getattr(importlib.import_module(module), cls)(url, settings)
    return store
