"""What the SQLite transport and result backend share: connections and the doorbell.

Connections are per thread and per process (``sqlite3`` objects must not cross either
boundary; a forked child opens its own). Writers wake waiters in other processes through
a doorbell: each waiter binds a Unix datagram socket in a directory derived from the
database path, and a writer sends one byte to every socket there after it commits. A
waiter therefore sleeps in ``select``/the event loop, never in a polling loop, and wakes
within a millisecond of a commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import select
import socket
import sqlite3
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ..errors import BrokerUnavailable, ConfigurationError, OperationalError

T = TypeVar("T")


def path_from_url(url: str) -> str:
    """``sqlite:///rel.db`` -> ``rel.db``; ``sqlite:////abs/x.db`` -> ``/abs/x.db``."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite":
        raise ConfigurationError(f"not a sqlite:// URL: {url!r}")
    if parts.netloc:
        raise ConfigurationError(
            f"sqlite URL {url!r} has a host; use sqlite:///relative.db or sqlite:////abs.db"
        )
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path or path == ":memory:":
        raise ConfigurationError(
            f"sqlite URL {url!r} needs a file path (an in-memory database cannot be shared)"
        )
    return os.path.abspath(path)


class Database:
    """One SQLite file: lazily opened per-thread connections and schema setup.

    Lock waits are ours, not SQLite's: its busy handler sleeps at least 1 ms (then 2, 5,
    10 ms...) whenever another connection holds the write lock, which is an eternity next
    to the tens of microseconds a write transaction here takes, and it made processes
    sharing the file queue behind sleeping waiters. Connections are opened with no busy
    timeout and ``_retry`` backs off from 20 us, doubling up to 2 ms, until
    ``busy_timeout`` seconds have passed.

    Faults of the file itself (read-only, cannot be opened, disk full, not a database)
    leave as celeriac's ``OperationalError`` naming the file and the reason in one line;
    ``role`` (``"broker"``, ``"results"``...) says whose file it is.
    """

    def __init__(self, path: str, schema: str, busy_timeout: float = 30.0,
                 role: str | None = None,
                 upgrade: Callable[[sqlite3.Connection], None] | None = None) -> None:
        self.path = path
        self.schema = schema
        self.upgrade = upgrade
        """Run after ``schema`` in its transaction: what plain SQL cannot say (a column
        added to a file of an earlier layout)."""
        self.busy_timeout = busy_timeout
        self.role = role
        self.label = f"{role} database {path}" if role else f"SQLite database {path}"
        self._local = threading.local()
        self._identity: tuple[int, int] | None = None
        """(device, inode) of the file the first connection opened: ``check_file``."""

    def conn(self) -> sqlite3.Connection:
        local = self._local
        conn: sqlite3.Connection | None = getattr(local, "conn", None)
        if conn is not None and local.pid == os.getpid():
            return conn
        conn = None
        try:
            conn = sqlite3.connect(self.path, timeout=0, isolation_level=None,
                                   check_same_thread=False)
            self._retry(conn.execute, "PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode: a commit survives a process crash; only an OS crash or
            # power loss can lose the last transactions.
            conn.execute("PRAGMA synchronous=NORMAL")
            with self._transaction(conn, immediate=True):
                _exec_script(conn, self.schema)
                if self.upgrade is not None:
                    self.upgrade(conn)
        except sqlite3.Error as exc:
            if conn is not None:
                conn.close()
            raise self.fault(exc, opening=True) from exc
        except BaseException:
            if conn is not None:
                conn.close()
            raise
        if self._identity is None:
            with contextlib.suppress(OSError):
                st = os.stat(self.path)
                self._identity = (st.st_dev, st.st_ino)
        local.conn, local.pid = conn, os.getpid()
        return conn

    @contextlib.contextmanager
    def transaction(
        self, conn: sqlite3.Connection | None = None, immediate: bool = True
    ) -> Iterator[sqlite3.Connection]:
        conn = conn or self.conn()
        try:
            with self._transaction(conn, immediate):
                yield conn
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, _BUGS):
                raise
            raise self.fault(exc) from exc

    @contextlib.contextmanager
    def _transaction(self, conn: sqlite3.Connection, immediate: bool
                     ) -> Iterator[sqlite3.Connection]:
        self._retry(conn.execute, "BEGIN IMMEDIATE" if immediate else "BEGIN")
        try:
            yield conn
            self._retry(conn.execute, "COMMIT")
        except BaseException:
            # A failed statement (or COMMIT) may leave the transaction open, or SQLite may
            # have rolled it back already: the error to report is the one that got here,
            # never a ROLLBACK's "no transaction is active".
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Rows of a read-only statement (outside a transaction)."""
        conn = self.conn()
        try:
            return self._retry(lambda: conn.execute(sql, params).fetchall())
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, _BUGS):
                raise
            raise self.fault(exc) from exc

    def check_file(self) -> None:
        """Raise ``OperationalError`` if the file at ``path`` is no longer the one this
        object opened: deleted (with its directory or not) or replaced.

        SQLite would not notice: its open descriptors keep the old file alive, and every
        write would land in a file nobody else can open. A stat and a compare."""
        if self._identity is None:
            return
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            directory = os.path.dirname(self.path)
            gone = "" if os.path.isdir(directory) else f", and so was its directory {directory}"
            raise OperationalError(f"{self.label} was deleted (or moved away) while in use"
                                   f"{gone}") from None
        except OSError:
            return  # unreadable path (a permission change): the next write says why
        if (st.st_dev, st.st_ino) != self._identity:
            raise OperationalError(
                f"{self.label} was replaced by another file while in use (inode "
                f"{self._identity[1]}, now {st.st_ino})")

    def fault(self, exc: sqlite3.Error, opening: bool = False) -> OperationalError:
        """``exc``, an error of the file itself, as one line naming the file and why.

        A failure to open is ``BrokerUnavailable`` (the broker cannot be reached), except
        a read-only file: it opens, and is refused at the first write."""
        code = getattr(exc, "sqlite_errorcode", 0)
        name = getattr(exc, "sqlite_errorname", "")
        directory, base = os.path.split(self.path)
        # SQLite says "readonly directory" only where access() does; as root, an
        # immutable directory shows as "unable to open" an existing file.
        locked_dir = os.path.isdir(directory) and not os.access(directory, os.W_OK)
        if code & 0xFF == sqlite3.SQLITE_READONLY or (
                code & 0xFF == sqlite3.SQLITE_CANTOPEN and locked_dir
                and os.path.exists(self.path)):
            if name == "SQLITE_READONLY_DIRECTORY" or locked_dir:
                return OperationalError(
                    f"{self.label} is read-only ({exc}): its directory {directory} is not "
                    f"writable, and SQLite must create {base}-wal and {base}-shm there")
            if name == "SQLITE_READONLY_DBMOVED":
                return OperationalError(f"{self.label} was moved or deleted while in use "
                                        f"({exc})")
            return OperationalError(
                f"{self.label} is read-only ({exc}); celeriac must be able to write to it "
                f"and to create {base}-wal and {base}-shm in {directory}")
        if opening:
            whose = f" (for the {self.role})" if self.role else ""
            if not os.path.isdir(directory):
                why = f"its directory {directory} does not exist ({exc})"
            elif locked_dir:
                why = f"its directory {directory} is not writable ({exc})"
            else:
                why = str(exc)
            return BrokerUnavailable(f"cannot open SQLite database {self.path}{whose}: {why}")
        if code & 0xFF == sqlite3.SQLITE_FULL:
            return OperationalError(f"{self.label}: the disk is full ({exc})")
        if code & 0xFF in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT):
            return OperationalError(f"{self.label} is not a SQLite database, or is "
                                    f"damaged ({exc})")
        return OperationalError(f"{self.label} failed: {exc}")

    def _retry(self, fn: Callable[..., T], *args: Any) -> T:
        delay, deadline = 20e-6, None
        while True:
            try:
                return fn(*args)
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                now = time.monotonic()
                deadline = deadline or now + self.busy_timeout
                if now >= deadline:
                    raise BrokerUnavailable(
                        f"{self.label} stayed locked for {self.busy_timeout:g}s: {exc}"
                    ) from exc
                time.sleep(delay)
                delay = min(delay * 2, 2e-3)

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            conn.close()
        self._local = threading.local()


_BUGS = (sqlite3.IntegrityError, sqlite3.ProgrammingError)
"""SQLite errors that are ours (a constraint, a bad statement), not the file's: raised as
they are, with their traceback."""


def _exec_script(conn: sqlite3.Connection, script: str) -> None:
    # executescript() would COMMIT our transaction first; run statement by statement.
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)


_DOORBELLS: weakref.WeakSet[Doorbell] = weakref.WeakSet()


def _after_fork() -> None:
    # A thread of the parent's may have held a doorbell's lock at the fork: the child
    # would wait on it for ever.
    for doorbell in list(_DOORBELLS):
        doorbell._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


class Doorbell:
    """Cross-process wake-ups for one database file and one channel."""

    def __init__(self, db_path: str, channel: str) -> None:
        key = hashlib.sha1(os.path.realpath(db_path).encode()).hexdigest()[:16]
        base = Path(tempfile.gettempdir()) / f"celeriac-{os.getuid()}"
        self.dir = base / key / channel
        self._sender: socket.socket | None = None
        self._sender_pid = 0
        # Two threads ringing first at once (a pool's and the loop's) would each make a
        # sender, and the one overwritten would be left for the collector, unclosed.
        self._lock = threading.Lock()
        _DOORBELLS.add(self)
        self._closed = False
        """After ``close``, a ring (a thread still finishing its work) uses a socket of its
        own and closes it: none is left for nobody to close."""
        self._peers: list[str] = []
        self._peers_mtime = -1

    # -- ringing ------------------------------------------------------------------------
    def ring(self) -> None:
        try:
            mtime = self.dir.stat().st_mtime_ns
        except FileNotFoundError:
            return
        # The cached listing is trusted only once the directory's mtime is safely in the
        # past: on a filesystem with coarse timestamps a listener bound in the same tick
        # as our last listing would not change the mtime we compare against.
        if mtime != self._peers_mtime or time.time_ns() - mtime < 50_000_000:
            self._peers = [str(p) for p in self.dir.iterdir()]
            self._peers_mtime = mtime
        sender = self._sender_socket()
        try:
            for peer in self._peers:
                try:
                    sender.sendto(b"!", peer)
                except BlockingIOError:
                    pass  # its buffer is full of rings it has not read: it will wake anyway
                except (ConnectionRefusedError, FileNotFoundError):
                    with contextlib.suppress(OSError):
                        os.unlink(peer)  # a waiter that died without cleaning up
                except OSError as exc:
                    if exc.errno != errno.EAGAIN:
                        raise
        finally:
            if self._closed:
                sender.close()

    def _sender_socket(self) -> socket.socket:
        if self._closed:
            one_shot = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            one_shot.setblocking(False)
            return one_shot
        with self._lock:
            if self._sender is None or self._sender_pid != os.getpid():
                if self._sender is not None:
                    self._sender.close()  # our copy of the parent's (a fork): theirs stays
                self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sender.setblocking(False)
                self._sender_pid = os.getpid()
            return self._sender

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._sender is not None and self._sender_pid == os.getpid():
                self._sender.close()
            self._sender = None

    # -- listening ----------------------------------------------------------------------
    def listen(self) -> Listener:
        for _ in range(5):
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            try:
                return Listener(self.dir)
            except FileNotFoundError:
                continue  # the last listener's close() removed the directory meanwhile
        raise OSError(f"cannot create a doorbell socket in {self.dir}")


class Listener:
    """A bound doorbell socket; ``wait`` and ``await wait_async`` return when rung."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.pid = os.getpid()
        self.path = str(directory / f"{self.pid}-{os.urandom(4).hex()}")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.sock.bind(self.path)
        except OSError:
            self.sock.close()
            raise
        self.sock.setblocking(False)

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while True:
                self.sock.recv(64)

    def wait(self, timeout: float) -> bool:
        """Block until rung or ``timeout`` seconds pass; True if rung."""
        ready, _, _ = select.select([self.sock], [], [], max(timeout, 0.0))
        return bool(ready)

    async def wait_async(self, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        fd = self.sock.fileno()

        def rung() -> None:
            if not fut.done():
                fut.set_result(True)

        loop.add_reader(fd, rung)
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
            # that lands as the future completes (a warm shutdown would hang).
            async with asyncio.timeout(max(timeout, 0.0)):
                return await fut
        except TimeoutError:
            return False
        finally:
            loop.remove_reader(fd)

    def close(self) -> None:
        if self.sock.fileno() == -1:
            return  # closed already
        self.sock.close()
        if self.pid != os.getpid():
            return  # a forked copy: the path is the parent's
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        # Leave no empty directories behind (rmdir fails harmlessly while others listen).
        with contextlib.suppress(OSError):
            self.directory.rmdir()
            self.directory.parent.rmdir()

    def __del__(self) -> None:
        # A thread's listener (the backend keeps one per thread) that nobody closed: its
        # thread ended, or it was made after the backend closed. Closed here, unlinked.
        with contextlib.suppress(Exception):
            self.close()
