"""Compression of task messages and results: kombu's names and formats, both ways, and
the bounds a worker keeps while it decompresses."""

from __future__ import annotations

import asyncio

import kombu.compression
import orjson
import pytest

from celeriac import Celeriac, ConfigurationError, DecodeError, Settings
from celeriac import compression as z
from celeriac.protocol import Message, validate_headers

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
    messages = _sent(app)
    assert [m.headers["compression"] for m in messages] == [
        "application/x-gzip", "application/x-bz2", "application/x-lzma",
        "application/x-gzip"]
    for message, letter in zip(messages, "abcd", strict=True):
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
