"""Compression of task messages and stored results, as Celery (kombu) does it.

Names, as kombu registers them, so that Celery's settings port unchanged::

    "gzip", "zlib"   application/x-gzip   (zlib's format: what kombu writes under it)
    "bzip2", "bzip"  application/x-bz2
    "lzma", "xz"     application/x-lzma

A task message names its compression in its ``compression`` header (the content type)
and its body is the serialized body, compressed. A stored result carries it in-band, as
Celery 5.7 stores it: ``MAGIC + content type + NUL + compressed payload``. No serializer's
output begins with a NUL byte, so a result stored before compression was turned on, or
by a producer without it, reads as it is.

Decompression is bounded: a body that would expand past ``limit`` bytes is refused (a few
KiB of zeros compress to almost nothing and would expand to gigabytes in a worker).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

from ..errors import ConfigurationError, DecodeError

MAGIC = b"\x00celery-compressed\x00"
"""What a compressed stored result begins with (Celery's ``COMPRESSED_PAYLOAD_MAGIC``)."""

HEADER = "compression"
"""The task message header that names the body's compression."""

# bz2 and lzma are imported when first used: together they are a few ms of every
# producer's import, and few deployments compress with them (issue 30).


def _bz2_compress(data: bytes) -> bytes:
    import bz2

    return bz2.compress(data)


def _lzma_compress(data: bytes) -> bytes:
    import lzma

    return lzma.compress(data)


_COMPRESSORS: dict[str, Callable[[bytes], bytes]] = {
    "application/x-gzip": zlib.compress,
    "application/x-bz2": _bz2_compress,
    "application/x-lzma": _lzma_compress,
}
LZMA_MEMORY = 128 * 1024 * 1024
"""The most an xz stream may ask for to decode (its dictionary is in its header, and
``xz -9`` asks for 65 MiB): a forged header cannot make a worker allocate gigabytes.
zlib's window (32 KiB) and bzip2's blocks (900 KB) are bounded by their formats."""


def _bz2_decompressor() -> Any:
    import bz2

    return bz2.BZ2Decompressor()


def _lzma_decompressor() -> Any:
    import lzma

    return lzma.LZMADecompressor(memlimit=LZMA_MEMORY)


def _corrupt(kind: str) -> tuple[type[BaseException], ...]:
    """What a corrupt or cut stream of ``kind`` raises (lzma's own error class only for
    lzma data, the one case where lzma is already imported)."""
    common = (zlib.error, OSError, EOFError, MemoryError)
    if kind != "application/x-lzma":
        return common
    import lzma

    return (*common, lzma.LZMAError)


_DECOMPRESSORS: dict[str, Callable[[], Any]] = {
    "application/x-gzip": zlib.decompressobj,
    "application/x-bz2": _bz2_decompressor,
    "application/x-lzma": _lzma_decompressor,
}
CONTENT_TYPES = tuple(_DECOMPRESSORS)
_NAMES = {"gzip": "application/x-gzip", "zlib": "application/x-gzip",
          "bzip2": "application/x-bz2", "bzip": "application/x-bz2",
          "lzma": "application/x-lzma", "xz": "application/x-lzma"}


def known_name(name: Any) -> bool:
    """Whether ``name`` is a compression this side can apply."""
    return isinstance(name, str) and _NAMES.get(name, name) in _COMPRESSORS


def content_type(name: str) -> str:
    """The content type for compression ``name`` (a name above, or a content type)."""
    found = _NAMES.get(name, name) if isinstance(name, str) else None
    if found not in _COMPRESSORS:
        raise ConfigurationError(f"unknown compression {name!r}: use one of "
                                 f"{', '.join(sorted(_NAMES))}")
    return found


def known(value: Any) -> bool:
    """Whether ``value`` is a compression content type this side can undo."""
    return isinstance(value, str) and value in _DECOMPRESSORS


def compress(data: bytes, name: str) -> tuple[str, bytes]:
    """``(content type, compressed data)``."""
    kind = content_type(name)
    return kind, _COMPRESSORS[kind](data)


def decompress(data: bytes, kind: str, limit: int) -> bytes:
    """``data`` as it was before ``compress``; ``DecodeError`` saying why when it cannot be
    undone: an unknown kind, corrupt or cut data, or more than ``limit`` bytes inside."""
    factory = _DECOMPRESSORS.get(kind)
    if factory is None:
        raise DecodeError(f"unknown compression {kind!r}")
    decompressor = factory()
    try:
        out = decompressor.decompress(data, limit + 1)
    except _corrupt(kind) as exc:
        raise DecodeError(f"corrupt {kind} data: {exc}") from None
    if len(out) > limit:
        raise DecodeError(f"{kind} data expands past {limit} bytes (max_message_size)")
    if not decompressor.eof:
        raise DecodeError(f"{kind} data is cut short")
    if decompressor.unused_data:
        # kombu's producers write one stream; more would be read as one by kombu.
        raise DecodeError(f"{kind} data has {len(decompressor.unused_data)} bytes after "
                          "its stream")
    return bytes(out)


def compress_payload(data: bytes, name: str) -> bytes:
    """A result payload compressed, naming its compression in-band (Celery's form)."""
    kind, body = compress(data, name)
    return b"".join([MAGIC, kind.encode(), b"\x00", body])


def decompress_payload(data: bytes, limit: int) -> bytes:
    """A stored result payload as it was serialized; one without the marker as it is."""
    if not data.startswith(MAGIC):
        return data
    kind, _, body = data[len(MAGIC):].partition(b"\x00")
    return decompress(body, kind.decode("utf-8", "replace"), limit)
