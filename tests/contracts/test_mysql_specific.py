"""What the MySQL/MariaDB backend (``mysql://``) does beyond the backend contract: its
URL, ids compared byte for byte, writers in ``seq`` order under concurrency, tables made
again after a reset, and errors that name the server without its password."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pymysql
import pytest

from celeriac import states
from celeriac.backends.base import create_backend
from celeriac.backends.mysql import MySQLBackend
from celeriac.errors import BrokerUnavailable, ConfigurationError
from celeriac.settings import Settings

from .conftest import _drop_mysql, _mysql_database


@pytest.fixture
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    made = f"{_mysql_database(tmp_path_factory.getbasetemp())}?namespace=ns_{uuid.uuid4().hex[:6]}"
    yield made
    _drop_mysql(made)


def _backend(url: str, **settings: object) -> MySQLBackend:
    b = create_backend(url, Settings(result_backend=url, **settings))
    assert isinstance(b, MySQLBackend)
    return b


def test_ids_differing_only_in_case_are_two_results(url: str) -> None:
    b = _backend(url)
    try:
        b.store("Task-A", states.SUCCESS, "upper")
        b.store("task-a", states.SUCCESS, "lower")
        got = b.get_many(["Task-A", "task-a"])
        assert got["Task-A"].result == "upper" and got["task-a"].result == "lower"
    finally:
        b.close()


def test_concurrent_writers_are_all_seen_by_one_waiter(url: str) -> None:
    """Writers commit in ``seq`` order (the counter row's lock), so a waiter reading only
    the rows past its cursor misses none of what four threads write at once."""
    waiter, ids = _backend(url), [f"c-{n}" for n in range(200)]
    writers = [_backend(url) for _ in range(4)]

    def write(b: MySQLBackend, mine: list[str]) -> None:
        for start in range(0, len(mine), 5):
            b.store_many([b.encode(t, states.SUCCESS, t) for t in mine[start:start + 5]])

    threads = [threading.Thread(target=write, args=(w, ids[n::4]))
               for n, w in enumerate(writers)]
    try:
        for thread in threads:
            thread.start()
        got = waiter.wait_for(ids, 20)
        assert {k: m.result for k, m in got.items()} == {t: t for t in ids}
    finally:
        for thread in threads:
            thread.join(10)
        for b in (waiter, *writers):
            b.close()


def test_tables_dropped_under_a_backend_are_made_again(url: str) -> None:
    b = _backend(url)
    try:
        b.store("before", states.SUCCESS, 1)
        conn = pymysql.connect(host="127.0.0.1", user="root", autocommit=True,
                               database=url.rsplit("/", 1)[1].split("?")[0])
        with conn.cursor() as cur:
            cur.execute(f"DROP TABLE `{b.namespace}_results`")
        conn.close()
        b.store("after", states.SUCCESS, 2)
        assert b.get("after") is not None and b.get("after").result == 2  # type: ignore[union-attr]
    finally:
        b.close()


def test_bad_urls_are_refused_naming_what_to_fix() -> None:
    with pytest.raises(ConfigurationError, match="names no database"):
        _backend("mysql://root@127.0.0.1:3306")
    with pytest.raises(ConfigurationError, match="unsafe namespace"):
        _backend("mysql://root@127.0.0.1:3306/test?namespace=1-bad")


def test_an_unreachable_server_is_named_without_its_password() -> None:
    b = _backend("mysql://root:secret@127.0.0.1:1/test", broker_connection_timeout=1)
    with pytest.raises(BrokerUnavailable) as caught:
        b.get("x")
    assert "127.0.0.1:1" in str(caught.value) and "secret" not in str(caught.value)
