"""Compression of task messages and results: kombu's names and formats, both ways, and
the bounds a worker keeps while it decompresses."""

from __future__ import annotations

import asyncio
import bz2
import lzma
import zlib

import kombu.compression
import orjson
import pytest

from celeriac import Celeriac, ConfigurationError, DecodeError, MessageTooLarge, Settings
from celeriac.protocol import Message, validate_headers
from celeriac.serialization import compression as z

DATA = orjson.dumps([["celeriac " * 500], {"n": 1}, {}])


@pytest.mark.parametrize(("name", "kind"), [
    ("gzip", "application/x-gzip"), ("zlib", "application/x-gzip"),
    ("bzip2", "application/x-bz2"), ("bzip", "application/x-bz2"),
    ("lzma", "application/x-lzma"), ("xz", "application/x-lzma"),
    ("application/x-bz2", "application/x-bz2"),
])
def test_kombus_names_and_formats_both_ways(name: str, kind: str) -> None:
    ours_kind, ours = z.compress(DATA, name)
    theirs, theirs_kind = kombu.compression.compress(DATA, name)
    assert ours_kind == theirs_kind == kind
    assert z.decompress(theirs, theirs_kind, len(DATA)) == DATA
    assert kombu.compression.decompress(ours, ours_kind) == DATA
    assert len(ours) < len(DATA) // 10


def test_results_carry_their_compression_in_band_and_plain_ones_pass() -> None:
    packed = z.compress_payload(DATA, "gzip")
    assert packed.startswith(b"\x00celery-compressed\x00application/x-gzip\x00")
    assert z.decompress_payload(packed, len(DATA)) == DATA
    assert z.decompress_payload(DATA, 10) == DATA  # not compressed: not bounded either


def test_decompression_is_bounded_and_says_what_is_wrong() -> None:
    kind, body = z.compress(DATA, "gzip")
    with pytest.raises(DecodeError, match=f"expands past {len(DATA) - 1} bytes"):
        z.decompress(body, kind, len(DATA) - 1)
    with pytest.raises(DecodeError, match="cut short"):
        z.decompress(body[:-4], kind, len(DATA))
    with pytest.raises(DecodeError, match="corrupt application/x-lzma data"):
        z.decompress(b"garbage", "application/x-lzma", 100)
    with pytest.raises(DecodeError, match="unknown compression 'application/zstd'"):
        z.decompress(body, "application/zstd", 100)


def forged_xz(dict_size_prop: int) -> bytes:
    """A valid xz stream whose header asks for a dictionary of ``dict_size_prop`` (LZMA2's
    property byte: 40 is 4 GiB), with the block header's CRC made right."""
    data = bytearray(lzma.compress(b"x" * 100, format=lzma.FORMAT_XZ, check=lzma.CHECK_NONE))
    size = (data[12] + 1) * 4
    block = data[12:12 + size]
    at = block.index(b"\x21\x01")  # the LZMA2 filter's id, one byte of properties
    block[at + 2] = dict_size_prop
    block[-4:] = zlib.crc32(bytes(block[:-4])).to_bytes(4, "little")
    data[12:12 + size] = block
    return bytes(data)


def test_a_forged_stream_cannot_make_a_worker_allocate_what_it_asks_for() -> None:
    assert z.decompress(forged_xz(18), "application/x-lzma", 1000) == b"x" * 100  # 4 MiB
    with pytest.raises(DecodeError, match="corrupt application/x-lzma data"):
        z.decompress(forged_xz(40), "application/x-lzma", 1000)  # asks for 4 GiB
    two = bz2.compress(b"a") + bz2.compress(b"b")  # kombu writes one stream
    with pytest.raises(DecodeError, match="bytes after its stream"):
        z.decompress(two, "application/x-bz2", 1000)


def test_max_message_size_counts_the_body_before_compression() -> None:
    app = Celeriac("z", broker="memory://z-size", backend="memory://z-size",
                   task_compression="gzip", result_compression="gzip", max_message_size=1000)
    with pytest.raises(MessageTooLarge, match=r"\d+ bytes before compression, over "
                                              r"max_message_size=1000; nothing was published"):
        app.send_task("t", ["a" * 5000])
    assert app.transport.queue_length("celery") == 0
    # A result a reader could not decompress is stored as it is, and reads back.
    app.backend.store("big", "SUCCESS", "b" * 5000)
    assert not app.backend._get(["big"])["big"][1].startswith(z.MAGIC)
    assert app.AsyncResult("big").get(timeout=1) == "b" * 5000
    app.close()


def test_unknown_names_are_refused_where_they_are_given() -> None:
    with pytest.raises(ConfigurationError, match="task_compression: unknown compression "
                                                 "'zip': use one of bzip, bzip2, gzip"):
        Settings(task_compression="zip")
    with pytest.raises(ConfigurationError, match="result_compression: unknown compression"):
        Settings(result_compression="brotli")
    app = Celeriac("z", broker="memory://z-names")
    with pytest.raises(ConfigurationError, match="task 'bad': compression: unknown"):
        app.task(name="bad", compression="rar")(lambda: None)
    with pytest.raises(ConfigurationError, match=r"cannot send t: unknown compression 'rar'.*"
                                                 r"nothing was published"):
        app.send_task("t", compression="rar")
    assert app.transport.queue_length("celery") == 0
    app.close()


def _sent(app: Celeriac) -> list[Message]:
    async def take() -> list[Message]:
        await app.transport.connect("reader")
        got = await app.transport.fetch(["celery"], 100, 0.1)
        return [d.message for d in got]
    return asyncio.run(take())


def test_producers_compress_as_asked_and_name_it_in_a_header() -> None:
    app = Celeriac("z", broker="memory://z-send", task_compression="gzip")

    @app.task(name="per_task", compression="bzip2")
    def per_task(text: str) -> str:
        return text

    @app.task(name="plain")
    def plain(text: str) -> str:
        return text

    plain.delay("a" * 1000)                                  # the setting
    per_task.delay("b" * 1000)                               # the task's option
    plain.apply_async(("c" * 1000,), compression="lzma")      # the call's
    plain.delay_many([("d" * 1000,)])                        # bulk: the setting
    per_task.s("e" * 1000).delay()                           # a signature: the task's
    messages = _sent(app)
    assert [m.headers["compression"] for m in messages] == [
        "application/x-gzip", "application/x-bz2", "application/x-lzma",
        "application/x-gzip", "application/x-bz2"]
    for message, letter in zip(messages, "abcde", strict=True):
        assert validate_headers(message.headers) is None
        body = z.decompress(message.body, message.headers["compression"], 10_000)
        assert orjson.loads(body)[0] == [letter * 1000]
        assert len(message.body) < 200
    app.close()


def test_unknown_compression_header_is_refused_where_the_message_enters() -> None:
    headers = {"task": "t", "id": "i", "compression": "application/x-rar"}
    assert "'compression' header 'application/x-rar'" in (validate_headers(headers) or "")
    assert "is not a compression" in (validate_headers({**headers, "compression": 7}) or "")


def test_results_are_stored_compressed_and_read_back() -> None:
    url = "memory://z-eager"
    app = Celeriac("z", broker=url, backend=url, result_compression="xz")

    app.backend.store("r-1", "SUCCESS", "e" * 5000)
    raw = app.backend._get(["r-1"])["r-1"][1]
    assert raw.startswith(b"\x00celery-compressed\x00application/x-lzma\x00")
    assert len(raw) < 500
    assert app.AsyncResult("r-1").get(timeout=1) == "e" * 5000
    app.close()


def test_what_a_worker_sends_after_a_task_is_compressed_and_routed_alike() -> None:
    from celeriac.canvas.followups import _message

    app = Celeriac("z", broker="memory://z-follow", task_compression="gzip",
                   task_queues=[kombu.Queue("media", routing_key="media.video")])

    @app.task(name="step", compression="xz")
    def step(text: str) -> str:
        return text

    lineage = {"root_id": "r", "parent_id": "p"}
    queue, message, _ = _message(app, "step", ["f" * 1000], {}, {}, {}, lineage)
    assert message.headers["compression"] == "application/x-lzma"  # the task's own
    queue, message, _ = _message(app, "other", ["g"], {}, {},
                                 {"routing_key": "media.video"}, lineage)
    assert (queue, message.headers["compression"]) == ("media", "application/x-gzip")
    body = z.decompress(message.body, "application/x-gzip", 1000)
    assert orjson.loads(body)[0] == ["g"]
    app.close()
