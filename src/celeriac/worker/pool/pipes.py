"""Length-prefixed frames over the pipes between the worker and its pool children.

A frame is ``!IB`` (payload length, kind) followed by the payload. Job frames carry
the task's body bytes untouched after a small JSON header, so the parent never decodes
or re-encodes a task body (DESIGN #5). The parent's ends are non-blocking and live on the
event loop (``FrameWriter`` keeps an outbound buffer and waits with ``add_writer`` when
a pipe is full); the child's ends are blocking.

Every task crosses these pipes twice, so the per-frame work is kept small: headers are
JSON arrays rather than objects (orjson decodes an array of six values in less than half
the time of the same object), and a frame is packed with one ``struct`` call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
from typing import Any

import orjson

HEADER = struct.Struct("!IB")
META_LEN = struct.Struct("!I")
BLOB_HEADER = struct.Struct("!IBI")
"""``HEADER`` followed by ``META_LEN``: the start of a ``frame_with_blob``."""

# Parent -> child
JOB = 1  # frame_with_blob: [job id, headers, content_type, queue, delivery_count,
#          hostname, soft_limit] + the task body
STOP = 2
# Child -> parent
UP = 10
DONE = 11  # frame_with_blob: [job id, action, state, reason, runtime, retire] and, with a
#           result to store or task events on, [..., content_type, expires_at, shown]
#           + the encoded result
RELAY_RESULT = 12  # a result for a backend that lives in the parent's memory:
#                    frame_with_blob, [task_id, content_type, expires_at] + the result
RELAY_PUBLISH = 13  # a message for a transport that lives in the parent's memory


def frame(kind: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(len(payload), kind) + payload


def frame_with_blob(kind: int, meta: Any, blob: bytes) -> bytes:
    """A JSON header and an opaque blob in one frame."""
    head = orjson.dumps(meta)
    return BLOB_HEADER.pack(META_LEN.size + len(head) + len(blob), kind, len(head)) + head + blob


def split_blob(payload: bytes) -> tuple[Any, bytes]:
    (n,) = META_LEN.unpack_from(payload, 0)
    end = META_LEN.size + n
    return orjson.loads(payload[META_LEN.size:end]), payload[end:]


class FrameReader:
    """Accumulates bytes and yields complete ``(kind, payload)`` frames."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        # The common case, one or more whole frames and nothing buffered, slices ``data``
        # directly; only a partial frame is copied into the buffer.
        if self.buffer:
            self.buffer += data
            data = bytes(self.buffer)
            self.buffer.clear()
        frames = []
        pos, size = 0, len(data)
        while size - pos >= HEADER.size:
            length, kind = HEADER.unpack_from(data, pos)
            end = pos + HEADER.size + length
            if size < end:
                break
            frames.append((kind, data[pos + HEADER.size:end]))
            pos = end
        if pos < size:
            self.buffer += data[pos:]
        return frames


class FrameWriter:
    """Non-blocking writes to one pipe with an outbound buffer (parent side)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        self.loop = loop
        self.fd = fd
        self.pending = bytearray()
        self.closed = False
        """No more writes (the child is gone); the descriptor may still be open."""
        self._fd_closed = False

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        if self.pending:
            self.pending += data
            return
        try:
            n = os.write(self.fd, data)
        except BlockingIOError:
            n = 0
        except (BrokenPipeError, OSError):
            self.closed = True  # the child is gone; the supervisor will notice
            return
        if n < len(data):
            self.pending += data[n:]
            self.loop.add_writer(self.fd, self._flush)

    def _flush(self) -> None:
        try:
            n = os.write(self.fd, self.pending)
        except BlockingIOError:
            return
        except OSError:
            # The child is gone. The descriptor stays open until the pool detaches the
            # child: closing it here would free its number while the pool still lists it.
            self.closed = True
            self.loop.remove_writer(self.fd)
            self.pending.clear()
            return
        del self.pending[:n]
        if not self.pending:
            self.loop.remove_writer(self.fd)

    def close(self) -> None:
        """Close the pipe, once: after that its number may be a newer pipe's."""
        if self.pending:
            self.loop.remove_writer(self.fd)
            self.pending.clear()
        self.closed = True
        if not self._fd_closed:
            self._fd_closed = True
            with contextlib.suppress(OSError):
                os.close(self.fd)


def read_frame(fd: int) -> tuple[int, bytes] | None:
    """Blocking read of one ``(kind, payload)`` frame (child side); None at EOF.

    The header first, then exactly its payload: two small reads cost less than one read
    into a 64 KiB buffer plus the bookkeeping of a ``FrameReader``.
    """
    header = _read_exact(fd, HEADER.size)
    if header is None:
        return None
    length, kind = HEADER.unpack(header)
    if not length:
        return kind, b""
    payload = _read_exact(fd, length)
    return None if payload is None else (kind, payload)


def _read_exact(fd: int, n: int) -> bytes | None:
    data = os.read(fd, n)
    if len(data) == n:
        return data
    # The parent wrote the frame in pieces (its pipe was full) or is gone.
    buffer = bytearray(data)
    while len(buffer) < n:
        if not data:
            return None
        data = os.read(fd, n - len(buffer))
        buffer += data
    return bytes(buffer)


def write_all(fd: int, data: bytes) -> None:
    """Blocking write of the whole buffer (child side)."""
    n = os.write(fd, data)
    if n < len(data):  # only a frame larger than the pipe's buffer
        view = memoryview(data)[n:]
        while view:
            n = os.write(fd, view)
            view = view[n:]
