"""Decoding that survives bytes which are not UTF-8 where AMQP expects text.

pamqp decodes short strings (``content_type``, ``correlation_id``...) and header-table
keys as strict UTF-8. One message with a byte that is not (any client can publish one:
pika takes bytes) makes it raise ``UnicodeDecodeError`` in the middle of aiormq's frame
reader, which closes the connection; RabbitMQ then hands the same message to the next
connection, and the worker crash-loops while the task behind it never runs.

``install()`` puts lenient decoders in front of pamqp's for those two types. They call
pamqp's own first and, only when it raises ``UnicodeDecodeError``, decode the same bytes
with ``surrogateescape``: each bad byte becomes a lone surrogate (``\\udcff``), which no
real text contains. The worker's header checks (``protocol.validate_headers`` and
``validate_properties``) refuse such text, so the message is dead-lettered with the
reason, and ``wire`` encodes those surrogates back to the original bytes, so the
dead letter is the message as it was published. Long strings need nothing: pamqp
already returns their bytes when they are not UTF-8.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from pamqp import decode

_LENGTH = struct.Struct(">I")
_installed = False


def install() -> None:
    """Make pamqp's decoding lenient (idempotent; process-wide, as pamqp's tables are)."""
    global _installed
    if _installed:
        return
    _installed = True
    decode.METHODS["shortstr"] = _lenient(decode.METHODS["shortstr"], _short_str)
    table = _lenient(decode.METHODS["table"], _field_table)
    decode.METHODS["table"] = table
    decode.TABLE_MAPPING[b"F"] = table  # tables nested in tables and arrays


Decoder = Callable[[bytes], tuple[int, Any]]


def _lenient(strict: Decoder, fallback: Decoder) -> Decoder:
    def decoder(value: bytes) -> tuple[int, Any]:
        try:
            return strict(value)
        except UnicodeDecodeError:
            return fallback(value)

    return decoder


def _short_str(value: bytes) -> tuple[int, str]:
    length = value[0]
    return length + 1, value[1:length + 1].decode("utf-8", "surrogateescape")


def _field_table(value: bytes) -> tuple[int, dict[str, Any]]:
    # pamqp's field_table, with the keys decoded leniently; values go through
    # embedded_value, which reaches the lenient decoders for nested tables.
    (length,) = _LENGTH.unpack_from(value, 0)
    end = 4 + length
    if end > len(value):
        raise ValueError("Field table length exceeds available data")
    offset, data = 4, {}
    while offset < end:
        key_length = value[offset]
        offset += 1
        key = value[offset:offset + key_length].decode("utf-8", "surrogateescape")
        offset += key_length
        consumed, data[key] = decode.embedded_value(value[offset:])
        offset += consumed
    return end, data
