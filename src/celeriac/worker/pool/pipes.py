"""Length-prefixed frames over the pipes between the worker and its pool children.

A frame is ``!IB`` (payload length, kind) followed by the payload. Job frames carry
the task's body bytes untouched after a small JSON header, so the parent never decodes
or re-encodes a task body (docs/architecture.md, decision 3). The parent's ends are
non-blocking and live on the event loop (``FrameWriter`` keeps an outbound buffer and
waits with ``add_writer`` when a pipe is full); the child's ends are blocking.

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

from ...backends.base import Stored
from ..execute import Job, Outcome

HEADER = struct.Struct("!IB")
META_LEN = struct.Struct("!I")
BLOB_HEADER = struct.Struct("!IBI")
"""``HEADER`` followed by ``META_LEN``: the start of a ``frame_with_blob``."""

# Parent -> child, on the job pipe
JOB = 1  # encode_job / decode_job
STOP = 2
CHORD_ANSWER = 4  # the answer to RELAY_CHORD: encode_chord_answer / decode_chord_answer
# Parent -> child, on the control pipe (channels.py)
RECALL = 3  # the job's seq, as text: hand this job back if it has not started
CANCEL = 5  # an async job's seq, as text: cancel it on the child's loop (revoke with
#             terminate); answered by that job's DONE, with state REVOKED if it was cut
# Child -> parent
UP = 10
DONE = 11  # encode_done / decode_done
RELAY_RESULT = 12  # a result for a backend that lives in the parent's memory:
#                    frame_with_blob, [task_id, content_type, expires_at] + the result
RELAY_PUBLISH = 13  # a message for a transport that lives in the parent's memory
RECALLED = 14  # the job's seq, as text: it was taken back unstarted
STARTED = 15  # the job's seq, as text: a RECALL came too late, the job has started
RELAY_CHORD = 16  # chord_part for a backend that lives in the parent's memory: JSON
#                   [group_id, task_id, size]; the parent answers CHORD_ANSWER on the
#                   job pipe (the child's RelayBackend waits for it)
PROGRESS = 17  # update_state of a running task, only with task events on (_progress.py):
#                JSON [task_id, state, meta]; encode_progress / decode_progress


def encode_job(job: Job, soft_limit: float | None, hard_limit: float | None = None) -> bytes:
    """``hard_limit`` only for an async job: its child cancels it then (the parent kills
    a child over a sync job's hard limit itself)."""
    # A JSON array, not an object: orjson decodes an array of seven values in less than
    # half the time of the same object, and every task crosses twice.
    meta: tuple[Any, ...] = (job.seq, job.headers, job.content_type, job.queue,
                             job.delivery_count, job.hostname, soft_limit)
    if hard_limit or job.properties or job.settle:
        meta += (hard_limit or None,)
    if job.properties or job.settle:
        meta += (job.properties,)
    if job.settle:
        meta += (job.settle,)
    return frame_with_blob(JOB, meta, job.body)


def decode_job(payload: bytes) -> tuple[Job, float | None, float | None]:
    """The job, and the soft and hard time limits the child enforces for it."""
    meta, body = split_blob(payload)
    seq, headers, content_type, queue, delivery_count, hostname, soft_limit = meta[:7]
    if len(meta) <= 7:
        return Job(seq, headers, body, content_type, queue, delivery_count, hostname), \
            soft_limit, None
    return (Job(seq, headers, body, content_type, queue, delivery_count, hostname,
                meta[8] if len(meta) > 8 else None,
                tuple(meta[9]) if len(meta) > 9 else None),
            soft_limit, meta[7])


def job_seq(payload: bytes) -> int:
    seq: int = split_blob(payload)[0][0]
    return seq


RETIRE, SETTLED = 1, 2
"""A DONE frame's flags: the child exits now; it settled the message itself."""


def encode_done(seq: int, outcome: Outcome, retire: bool) -> bytes:
    """A child's report on job ``seq``: its ``Outcome``, and ``retire``: the child exits
    now (max tasks or memory) and takes no further job. The outcome's fields go in a JSON
    array, the encoded result as the blob after it."""
    stored, shown = outcome.stored, outcome.shown
    flags = (RETIRE if retire else 0) | (SETTLED if outcome.settled else 0)
    meta: list[Any] = [seq, flags, outcome.action, outcome.state, outcome.reason,
                       outcome.runtime]
    if stored is not None or shown is not None:  # the common no-result case stays short
        meta += [stored.task_id, stored.content_type, stored.expires_at, shown] if stored \
            else [None, None, None, shown]
    return frame_with_blob(DONE, meta, stored.data if stored else b"")


def decode_done(payload: bytes) -> tuple[int, bool, Outcome]:
    """``encode_done``'s (seq, retire, outcome). A plain tuple, unpacked where it is read:
    the parent decodes one per task."""
    meta, data = split_blob(payload)
    if len(meta) == 6:
        seq, flags, action, state, reason, runtime = meta
        return seq, bool(flags & RETIRE), Outcome(action, state, reason, runtime,
                                                  settled=bool(flags & SETTLED))
    seq, flags, action, state, reason, runtime, task_id, content_type, expires_at, shown = meta
    return seq, bool(flags & RETIRE), Outcome(
        action, state, reason, runtime,
        None if task_id is None else Stored(task_id, content_type, data, expires_at),
        None if shown is None else (shown[0], shown[1]), bool(flags & SETTLED))


def encode_progress(task_id: str, state: str, meta_json: bytes) -> bytes:
    """``meta_json`` is spliced in as it is (the child made it; it is valid JSON)."""
    return frame(PROGRESS, orjson.dumps([task_id, state, orjson.Fragment(meta_json)]))


def decode_progress(payload: bytes) -> tuple[str, str, Any]:
    task_id, state, meta = orjson.loads(payload)
    return task_id, state, meta


def encode_chord_part(group_id: str, task_id: str, size: int) -> bytes:
    return frame(RELAY_CHORD, orjson.dumps([group_id, task_id, size]))


def decode_chord_part(payload: bytes) -> tuple[str, str, int]:
    group_id, task_id, size = orjson.loads(payload)
    return group_id, task_id, size


def encode_chord_answer(fired: bool | None, error: str = "") -> bytes:
    """``fired``, or None and why the parent's ``chord_part`` failed."""
    return frame(CHORD_ANSWER, b"!" + error.encode() if fired is None else
                 b"1" if fired else b"0")


def decode_chord_answer(payload: bytes) -> bool | str:
    """The answer, or the parent's error message."""
    if payload.startswith(b"!"):
        return payload[1:].decode()
    return payload == b"1"


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


def read_frames(fd: int, limit: int = 1 << 16) -> list[tuple[int, bytes]] | None:
    """Every frame that is in the pipe now, whole (child side, async mode): one read of up
    to ``limit`` bytes, then blocking reads for the rest of a frame it cut (the parent
    wrote it, in parts: the rest is coming). Never leaves part of a frame in the pipe,
    which the control thread reads too. None at EOF."""
    data = os.read(fd, limit)
    if not data:
        return None
    frames: list[tuple[int, bytes]] = []
    pos, size = 0, len(data)
    while pos < size:
        if size - pos < HEADER.size:
            rest = _read_exact(fd, HEADER.size - (size - pos))
            if rest is None:
                return None
            data, pos, size = data[pos:] + rest, 0, HEADER.size
        length, kind = HEADER.unpack_from(data, pos)
        start, end = pos + HEADER.size, pos + HEADER.size + length
        if end > size:
            rest = _read_exact(fd, end - size)
            if rest is None:
                return None
            frames.append((kind, data[start:] + rest))
            break
        frames.append((kind, data[start:end]))
        pos = end
    return frames


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
