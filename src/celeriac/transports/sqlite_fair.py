"""Fair queues on the SQLite broker (``broker_fair_queues``), as the Redis broker's
``publish.lua`` has them: fair queuing by start tags.

A fair queue's message gets a tag as it is published: one past the later of its fair
key's last tag and the queue's virtual time (the tag at the queue's head when last seen,
kept in ``fair_tags`` so it never goes back). The fetch is the plain one: every queue
is taken by ``priority DESC, tag, id`` on one index (``messages_next``), and a plain
message's tag is NULL, which sorts first, so a plain queue stays FIFO within a priority.
A key that sends 50,000 at once tags them 1..50,000; one that comes later starts at the
head's tag, so its messages alternate with the first key's from where the consumers are.

The tags are assigned inside the publish's write transaction, which SQLite serializes:
two producers never read the same key's last tag.

Its table (beside ``transports/sqlite.py``'s): ``fair_tags``, below.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

FAIR_HEADER = "celeriac_fair"
"""The message's fair key (``producer/flow.py`` names it; the layers keep that import out
of a transport)."""

FAIR_SCHEMA = """
CREATE TABLE IF NOT EXISTS fair_tags (
    queue TEXT NOT NULL,
    fair_key TEXT NOT NULL,
    tag INTEGER NOT NULL,
    PRIMARY KEY (queue, fair_key)
) WITHOUT ROWID
"""
"""A fair queue's virtual time (``fair_key`` '') and each fair key's last tag (``fair_key``
'k' and the key, so that the key '' has a row of its own), as the Redis broker's
``<namespace>:fair:<queue>`` hash: a row per key the queue has seen, kept until deleted."""

NEXT_INDEX = """
CREATE INDEX IF NOT EXISTS messages_next ON messages (queue, priority DESC, tag, id)
    WHERE owner IS NULL AND eta IS NULL
"""
"""The ready messages in the order they are taken. It replaces the earlier layout's
``messages_ready`` (``queue, priority DESC, id``): with every tag NULL the order is that
one's."""


def upgrade(conn: sqlite3.Connection) -> None:
    """Bring a file of the earlier layout (no ``tag`` column) up to this one; run in the
    schema's transaction as each connection opens (``clients/sqlite.py``)."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(messages)")}
    if "tag" not in columns:
        conn.execute("ALTER TABLE messages ADD COLUMN tag INTEGER")
        # Only here: a worker of the earlier version on the same file makes it again as it
        # opens, and dropping it on every open would churn the schema under both.
        conn.execute("DROP INDEX IF EXISTS messages_ready")
    conn.execute(NEXT_INDEX)


class _Queue:
    """One fair queue's state as a batch reads it once and writes it back once."""

    __slots__ = ("stored_vt", "tags", "vt")

    def __init__(self, stored_vt: int, vt: int) -> None:
        self.stored_vt, self.vt = stored_vt, vt
        self.tags: dict[str, int] = {}


# One statement for the first message of a queue in a batch: the stored virtual time, the
# tag at the head (the next message taken: the highest priority's lowest tag, as Redis's
# head score; one step on messages_next) and the key's last tag.
_FIRST = """
SELECT (SELECT tag FROM fair_tags WHERE queue = ?1 AND fair_key = ''),
       (SELECT tag FROM messages WHERE owner IS NULL AND eta IS NULL AND queue = ?1
        ORDER BY priority DESC, tag, id LIMIT 1),
       (SELECT tag FROM fair_tags WHERE queue = ?1 AND fair_key = ?2)
"""
_LAST = "SELECT tag FROM fair_tags WHERE queue = ? AND fair_key = ?"
_SAVE = ("INSERT INTO fair_tags (queue, fair_key, tag) VALUES (?, ?, ?)"
         " ON CONFLICT (queue, fair_key) DO UPDATE SET tag = excluded.tag")


def assign_tags(conn: sqlite3.Connection, wanted: Sequence[tuple[str, str] | None]
                ) -> list[int | None]:
    """The tag of each ``(queue, fair key)`` in publish order (None: not fair), with the
    queues' state updated; in the publish's write transaction."""
    queues: dict[str, _Queue] = {}
    tags: list[int | None] = []
    for pair in wanted:
        if pair is None:
            tags.append(None)
            continue
        queue, key = pair
        field = "k" + key
        state = queues.get(queue)
        if state is None:
            stored, head, last = conn.execute(_FIRST, (queue, field)).fetchone()
            # An untagged head (a dead letter requeued, a message from a producer that
            # does not know the queue is fair) leaves the time where it was.
            state = queues[queue] = _Queue(stored or 0, max(stored or 0, head or 0))
        else:
            last = state.tags.get(field)
            if last is None:
                row = conn.execute(_LAST, (queue, field)).fetchone()
                last = row[0] if row else None
        tag = max(state.vt, last or 0) + 1
        state.tags[field] = tag
        tags.append(tag)
    saved = [(queue, field, tag) for queue, state in queues.items()
             for field, tag in state.tags.items()]
    saved += [(queue, "", state.vt) for queue, state in queues.items()
              if state.vt != state.stored_vt]
    conn.executemany(_SAVE, saved)
    return tags
