"""The order a fair queue hands messages out in, on the Redis broker (``publish.lua``'s
fair tags) and the SQLite broker (``transports/sqlite_fair.py``, the same tags), no
worker: a key that comes later alternates with one that came first from where the
consumers are; priority still comes first; a message given back keeps its place; a
delayed message keeps the place it was tagged with; a queue not declared fair is FIFO as
ever. SQLite also: a file of the earlier layout opens, and producers in threads at once
tag every key in turn."""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from celeriac import Settings
from celeriac.protocol import Message
from celeriac.testing import wait_until
from celeriac.transports.base import Outgoing, Transport, create_transport
from tests.contracts.conftest import _drop_redis_namespace
from tests.loops import run, track
from tests.services import require


@pytest.fixture(params=["redis", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fair.db'}"
        return
    url = f"{require('redis')}?namespace=ffo{uuid.uuid4().hex[:10]}"
    yield url
    _drop_redis_namespace(url)


def transport(url: str) -> Transport:
    return track(create_transport(url, Settings(broker_url=url,
                                                broker_fair_queues=("fair",))))


def msg(key: str | None, n: int, priority: int = 0) -> Message:
    headers = {"task": "t", "id": f"{key}{n}", **({"celeriac_fair": key} if key else {})}
    return Message(headers=headers, body=b"[]", properties={"priority": priority})


def order(url: str, queue: str, n: int, give_back: int = 0) -> list[str]:
    async def go() -> list[str]:
        c = transport(url)
        await c.connect("reader")
        got = await c.fetch([queue], give_back, 1.0) if give_back else []
        if got:
            await c.requeue(got, redelivered=False)
        out = [d.message.headers["id"] for d in await c.fetch([queue], n, 1.0)]
        await c.disconnect()
        c.close()
        return out

    return run(go())


def test_a_later_key_alternates_with_the_first_from_the_head(url: str) -> None:
    p = transport(url)
    for i in range(1, 6):
        p.publish("fair", msg("a", i))
    for i in range(1, 3):
        p.publish("fair", msg("b", i))
    p.publish("fair", msg("c", 1, priority=9))  # the highest priority: first, fair or not
    # a1 heads the queue (tag 1): b's tags start after it and interleave with a's;
    # equal tags go in publish order.
    assert order(url, "fair", 8, give_back=2) == ["c1", "a1", "a2", "b1", "a3", "b2",
                                                  "a4", "a5"]
    p.close()


def test_without_a_key_on_a_fair_queue_is_the_key_nobody_named(url: str) -> None:
    p = transport(url)
    for i in range(1, 4):
        p.publish("fair", msg(None, i))
    p.publish("fair", msg("x", 1))
    assert order(url, "fair", 4) == ["None1", "None2", "x1", "None3"]
    for i in range(1, 4):
        p.publish("plain", msg("x", i))
    p.publish("plain", msg("y", 1))
    assert order(url, "plain", 4) == ["x1", "x2", "x3", "y1"]  # not fair: FIFO
    p.close()


def test_a_delayed_message_takes_the_place_it_was_tagged_with(url: str) -> None:
    p = transport(url)
    p.publish_many([Outgoing("fair", msg("a", i)) for i in range(1, 4)])
    p.publish("fair", msg("b", 1), delay=0.3)
    due = time.time() + 0.3
    wait_until(lambda: time.time() > due + 0.05, 5, message="the delay over")
    # b1 was tagged 2 (a1's tag, the head's, plus one) when published: it joins there.
    assert order(url, "fair", 4) == ["a1", "a2", "b1", "a3"]
    p.close()


# -- SQLite only ------------------------------------------------------------------------
EARLIER_LAYOUT = """
CREATE TABLE messages (id INTEGER PRIMARY KEY, queue TEXT NOT NULL,
    priority INTEGER NOT NULL DEFAULT 0, eta REAL, owner TEXT,
    deliveries INTEGER NOT NULL DEFAULT 0, envelope BLOB NOT NULL, body BLOB NOT NULL);
CREATE INDEX messages_ready ON messages (queue, priority DESC, id)
    WHERE owner IS NULL AND eta IS NULL;
"""


def test_sqlite_file_of_the_earlier_layout_opens_and_goes_fair(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:
        conn.executescript(EARLIER_LAYOUT)
        conn.execute("INSERT INTO messages (queue, envelope, body) VALUES ('fair', ?, ?)",
                     (msg("old", 1).envelope(), b"[]"))
    conn.close()
    url = f"sqlite:///{db}"
    p = transport(url)
    for i in range(1, 3):
        p.publish("fair", msg("a", i))
    p.publish("fair", msg("b", 1))
    # The untagged message (published before the upgrade) goes first.
    assert order(url, "fair", 4) == ["old1", "a1", "b1", "a2"]
    with sqlite3.connect(db) as conn:
        indexes = {r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'messages'")}
    conn.close()
    assert "messages_next" in indexes and "messages_ready" not in indexes, indexes
    p.close()


def test_sqlite_producers_at_once_tag_every_key_in_turn(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fair.db'}"
    transport(url).publish("fair", msg("head", 1))  # tag 1: every key starts past it
    keys, per_key = [f"k{i}" for i in range(4)], 30

    def produce(key: str) -> None:
        p = transport(url)  # a transport per thread, as producers in processes have
        for start in range(0, per_key, 10):
            p.publish_many([Outgoing("fair", msg(key, n))
                            for n in range(start, start + 10)])
        p.close()

    threads = [threading.Thread(target=produce, args=(k,)) for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    got = order(url, "fair", 1 + len(keys) * per_key)
    assert got[0] == "head1"
    for key in keys:  # FIFO within a key
        mine = [int(i[len(key):]) for i in got if i.startswith(key)]
        assert mine == list(range(per_key)), (key, mine)
    # In turn: the first 40 after the head hold each key's first 10, whatever the order
    # the threads wrote in.
    assert Counter(i[:2] for i in got[1:41]) == {k: 10 for k in keys}, got[1:41]
