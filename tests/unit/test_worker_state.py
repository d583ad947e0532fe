"""``celeriac.worker.state``: Celery's ``revoked_stamps`` and how a message's stamps
(Celery's ``stamped_headers``/``stamps`` headers) match them; the consumer's refusal of a
matching message with an in-process worker; the ``revoke_by_stamped_headers`` command's
arguments."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from celeriac import Celeriac, states
from celeriac.control.registry import COMMANDS, convert
from celeriac.errors import TaskRevoked
from celeriac.testing import ThreadedWorker
from celeriac.worker import state as worker_state
from celeriac.worker.state import (
    add_revoked_stamps,
    message_stamps,
    revoked_stamps,
    revoking_stamps,
    stamps_match,
)


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    revoked_stamps.clear()
    yield
    revoked_stamps.clear()


def _headers(**stamps: object) -> dict[str, object]:
    return {"task": "t", "id": "i", "stamped_headers": list(stamps), "stamps": stamps}


def test_the_mapping_is_celerys_and_accumulates() -> None:
    assert worker_state.revoked_stamps is revoked_stamps
    add_revoked_stamps({"m": "a"})
    add_revoked_stamps({"m": ["b", "a"], "n": 4242})
    assert revoked_stamps == {"m": ["a", "b"], "n": [4242]}


@pytest.mark.parametrize("stamp, match", [
    ("a", {"m": ["a"]}), (["x", "b"], {"m": ["b"]}), ("z", {}), (None, {}),
    ({"not": "hashable"}, {}), ([["nested"]], {}),
])
def test_a_stamp_matches_by_value_or_one_of_its_values(stamp: object,
                                                       match: dict[str, list[object]]) -> None:
    add_revoked_stamps({"m": ["a", "b"]})
    assert revoking_stamps(_headers(m=stamp)) == match


def test_only_the_names_in_stamped_headers_count_and_bad_shapes_match_nothing() -> None:
    add_revoked_stamps({"m": "a"})
    assert revoking_stamps({"stamped_headers": ["other"], "stamps": {"m": "a"}}) == {}
    assert revoking_stamps({"stamped_headers": "m", "stamps": {"m": "a"}}) == {"m": ["a"]}
    for bad in ({"stamped_headers": ["m"], "stamps": "a"},
                {"stamped_headers": 5, "stamps": {"m": "a"}},
                {"stamped_headers": [None, 3], "stamps": {"m": "a"}}, {}):
        assert revoking_stamps(bad) == {}
    assert message_stamps(_headers(m=1, n=2)) == {"m": 1, "n": 2}
    assert stamps_match({"m": 1}, {"m": 1}) == {"m": [1]}


def test_the_command_takes_a_dict_or_celerys_name_value_words() -> None:
    spec = COMMANDS["revoke_by_stamped_headers"]
    assert convert(spec, ["m=a", "n=b"]) == {"headers": ["m=a", "n=b"]}
    assert spec.check({"headers": {"m": ["a"]}, "terminate": True}) == {
        "headers": {"m": ["a"]}, "terminate": True}


def test_an_in_process_worker_refuses_a_matching_message(memory_app: Celeriac) -> None:
    @memory_app.task
    def add(x: int, y: int) -> int:
        return x + y

    stamped = {"stamped_headers": ["monitoring_id"], "stamps": {"monitoring_id": "m1"}}
    add_revoked_stamps({"monitoring_id": ["m1"]})
    with ThreadedWorker(memory_app):
        res = add.apply_async((1, 1), headers=stamped)
        with pytest.raises(TaskRevoked):
            res.get(timeout=10)
        assert res.state == states.REVOKED
        assert add.apply_async((2, 2)).get(timeout=10) == 4
        # Cleared (as Celery's suite does between tests): the same stamp runs.
        worker_state.revoked_stamps.clear()
        assert add.apply_async((3, 3), headers=stamped).get(timeout=10) == 6
