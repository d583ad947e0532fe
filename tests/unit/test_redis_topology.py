"""Redis URL forms (``celeriac.clients.redis.topology``): Sentinel in our form and kombu's,
Cluster, ``replicas_ack``, and the errors that name what is missing."""

from __future__ import annotations

import pytest

from celeriac.clients.redis.topology import master_url, parse
from celeriac.errors import ConfigurationError
from celeriac.transports.base import transport_class


def test_sentinel_url_in_our_form() -> None:
    url = "redis+sentinel://:s3cret@h1:26379;h2:26380;h3/2?master=mymaster&namespace=app"
    [e], durability = parse(url.split(";"), {}, "broker")
    assert e.sentinels is not None
    assert e.sentinels.hosts == (("h1", 26379), ("h2", 26380), ("h3", 26379))
    assert e.sentinels.master == "mymaster"
    assert e.namespace == "app"
    assert "s3cret" in e.secrets and "s3cret" not in e.safe
    assert master_url(e, "10.0.0.5", 6380) == "redis://:s3cret@10.0.0.5:6380/2"
    assert durability.replicas == 0


def test_sentinel_url_in_kombus_form_with_the_master_in_the_options() -> None:
    urls = ["sentinel://h1:26379/0", "sentinel://h2:26379/0"]
    [e], _ = parse(urls, {"master_name": "m", "sentinel_kwargs": {"password": "pw"}},
                   "broker")
    assert e.sentinels is not None
    assert e.sentinels.hosts == (("h1", 26379), ("h2", 26379))
    assert (e.sentinels.master, e.sentinels.password) == ("m", "pw")
    assert e.namespace == "celeriac"
    assert master_url(e, "h", 1) == "redis://h:1/0"


@pytest.mark.parametrize("role, setting", [("broker", "broker_transport_options"),
                                           ("result backend",
                                            "result_backend_transport_options")])
def test_a_sentinel_url_without_a_master_name_says_where_to_put_it(role: str, setting: str
                                                                  ) -> None:
    with pytest.raises(ConfigurationError, match=rf"names no master.*\?master=.*{setting}"):
        parse(["redis+sentinel://:pw@h1:26379/0"], {}, role)


def test_replicas_ack_from_the_url_or_the_options() -> None:
    _, d = parse(["redis+sentinel://h:26379/0?master=m&replicas_ack=1"], {}, "broker")
    assert (d.replicas, d.timeout_ms) == (1, 1000)
    _, d = parse(["redis://h:6379/0"], {"replicas_ack": "2", "replicas_ack_timeout": 50},
                 "broker")
    assert (d.replicas, d.timeout_ms) == (2, 50)
    with pytest.raises(ConfigurationError, match="replicas_ack must be a whole number"):
        parse(["redis://h:6379/0?replicas_ack=many"], {}, "broker")


def test_our_parameters_never_reach_redis_py() -> None:
    [e], _ = parse(["redis://h:6379/0?namespace=x&replicas_ack=1&health_check_interval=5"],
                   {}, "broker")
    assert e.url == "redis://h:6379/0?health_check_interval=5"


def test_cluster_url() -> None:
    url = "redis+cluster://:pw@n1:7000;n2:7001/0?namespace=q"
    [e], _ = parse(url.split(";"), {}, "broker")
    assert e.cluster == (("n1", 7000), ("n2", 7001))
    assert e.namespace == "q" and "pw" not in e.safe
    with pytest.raises(ConfigurationError, match="database 0 only"):
        parse(["redis+cluster://n1:7000/3"], {}, "broker")


def test_schemes_pick_the_transport() -> None:
    assert transport_class("redis+sentinel://h:26379/0?master=m").__name__ == "RedisTransport"
    assert transport_class("sentinel://h:26379/0").__name__ == "RedisTransport"
    assert transport_class("redis+cluster://h:7000").__name__ == "RedisClusterTransport"


def test_failover_lists_keep_one_endpoint_per_url() -> None:
    endpoints, _ = parse(["redis://a:1/0?namespace=x", "redis://:pw@b:2/0"], {}, "broker")
    assert [e.url for e in endpoints] == ["redis://a:1/0", "redis://:pw@b:2/0"]
    assert [e.namespace for e in endpoints] == ["x", "celeriac"]
    assert endpoints[1].secrets == ("pw",)
