"""Every one of Celery's setting names is implemented, converted, harmless (one warning)
or refused with a clear message: none is ignored in silence, from any source."""

from __future__ import annotations

import dataclasses
import logging
import types
from datetime import timedelta
from typing import Any

import pytest

from celeriac import Celeriac, ConfigurationError, Settings
from celeriac.settings import config as config_module
from celeriac.settings.celery_names import DEFAULTS as CELERY_DEFAULTS
from celeriac.settings.celery_names import OLD_NAMES
from celeriac.settings.config import CONVERTED, HARMLESS, REFUSED

FIELDS = {f.name for f in dataclasses.fields(Settings)}
BACKEND_PREFIXES = config_module._OTHER_BACKENDS


def disposition(name: str) -> str:
    if name in FIELDS:
        return "implemented"
    if name in CONVERTED:
        return "converted"
    if name in HARMLESS or name.startswith(config_module.OTHER_SERVICES):
        return "harmless"
    if name in REFUSED or name.startswith(BACKEND_PREFIXES):
        return "refused"
    return "ignored"


def other_than(default: Any) -> Any:
    """A value that differs from Celery's default: asking for something."""
    if isinstance(default, bool):
        return not default
    if isinstance(default, (int, float)):
        return default + 7
    if isinstance(default, str):
        return default + "-changed"
    if isinstance(default, (list, tuple)):
        return ["changed"]
    if isinstance(default, dict):
        return {"changed": 1}
    return "changed"


@pytest.mark.parametrize("name", sorted(CELERY_DEFAULTS))
def test_every_celery_setting_has_a_disposition(name: str) -> None:
    assert disposition(name) != "ignored", f"{name} would be ignored in silence"


@pytest.mark.parametrize("name", sorted(n for n in CELERY_DEFAULTS
                                        if disposition(n) == "refused"))
def test_refused_settings_raise_naming_the_setting_and_why(name: str) -> None:
    value = other_than(CELERY_DEFAULTS[name])
    with pytest.raises(ConfigurationError, match=rf"setting {name}=.* is not supported: \w"):
        Settings().replace(**{name: value})
    # Asking for Celery's default asks for nothing: accepted.
    Settings().replace(**{name: CELERY_DEFAULTS[name]})


@pytest.mark.parametrize("name", sorted(HARMLESS))
def test_harmless_settings_warn_once_with_the_reason(
        name: str, caplog: pytest.LogCaptureFixture) -> None:
    config_module._warned.discard(name)
    with caplog.at_level(logging.WARNING, logger="celeriac.settings.config"):
        Settings().replace(**{name: other_than(CELERY_DEFAULTS.get(name))})
        Settings().replace(**{name: other_than(CELERY_DEFAULTS.get(name))})
    lines = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert len(lines) == 1 and "has no effect in celeriac" in lines[0]


def test_a_typo_is_an_error_with_the_closest_name() -> None:
    with pytest.raises(ConfigurationError, match="did you mean task_serializer"):
        Settings().replace(taks_serializer="json")
    with pytest.raises(ConfigurationError, match="did you mean CELERY_TASK_SERIALIZER"):
        Settings.from_object({"CELERY_TASK_SERIALISER": "json"})


def test_converted_settings_mean_what_celery_means() -> None:
    s = Settings().replace(worker_disable_prefetch=True, task_publish_retry=False,
                           task_publish_retry_policy={"max_retries": 9},
                           task_reject_on_worker_lost=False)
    assert s.worker_prefetch_multiplier == 1
    assert s.broker_connection_retry is False
    assert s.broker_connection_max_retries == 9
    assert s.task_max_deliveries == 1


def test_values_in_the_forms_celerys_docs_show() -> None:
    s = Settings(worker_concurrency="4", task_acks_late="false", accept_content=["json"],
                 result_expires=timedelta(hours=1), task_time_limit="30",
                 worker_autoscale=[4, 1], include=["a.tasks"])
    assert (s.worker_concurrency, s.task_acks_late, s.accept_content) == (4, False, ("json",))
    assert (s.result_expires, s.task_time_limit) == (3600.0, 30.0)
    assert (s.worker_autoscale, s.include) == ((4, 1), ("a.tasks",))
    assert hash(s.accept_content)  # a list made every result read fail (unhashable)


def test_chord_retry_interval_is_honoured_from_celerys_names() -> None:
    app = Celeriac("chords", broker="memory://chords")
    app.config_from_object({"CELERY_RESULT_CHORD_RETRY_INTERVAL": "0.5"})
    assert app.settings.result_chord_retry_interval == 0.5  # a setting now, no warning
    app.close()


@pytest.mark.parametrize("changes, message", [
    ({"worker_concurrency": "four"}, "worker_concurrency='four': expected int"),
    ({"task_serializer": "yaml"}, "task_serializer: unknown serializer 'yaml'"),
    ({"accept_content": ["json", "yaml"]}, "accept_content: unknown serializer 'yaml'"),
    ({"task_acks_late": "perhaps"}, "task_acks_late='perhaps': expected bool"),
    ({"task_routes": {"a": {"queue": "q", "exchange": "x"}}}, "exchange 'x' is not supported"),
    ({"task_routes": {"a": {"delivery_mode": 1}}}, r"\['delivery_mode'\] not supported"),
    ({"task_annotations": {"a": {"on_failure": print}}}, "on_failure cannot be annotated"),
    ({"task_default_rate_limit": "fast"}, "task_default_rate_limit: "),
    ({"result_chord_retry_interval": 0}, "result_chord_retry_interval must be > 0"),
])
def test_bad_values_are_refused_at_load_naming_the_setting(changes: dict[str, Any],
                                                           message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Settings().replace(**changes)


def test_a_module_an_object_and_a_dict_are_read_alike() -> None:
    module = types.ModuleType("proj_config")
    module.task_serializer = "json"  # type: ignore[attr-defined]
    module.worker_concurrency = 3  # type: ignore[attr-defined]
    module.timedelta = timedelta  # type: ignore[attr-defined]  # an import: not a setting

    class Config:
        task_serializer = "json"
        worker_concurrency = 3

    for source in (module, Config, {"task_serializer": "json", "worker_concurrency": 3}):
        assert Settings.from_object(source).worker_concurrency == 3
    module.beat_scheduel = {}  # type: ignore[attr-defined]
    with pytest.raises(ConfigurationError, match=r"unknown setting 'beat_scheduel'.*beat_schedule"):
        Settings.from_object(module)


def test_django_namespace_and_celerys_old_uppercase_names() -> None:
    django = {"CELERY_BROKER_URL": "memory://ns", "CELERY_TASK_ACKS_LATE": False,
              "DEBUG": True, "INSTALLED_APPS": ["x"], "SECRET_KEY": "s"}
    s = Settings.from_object(django, namespace="CELERY")
    assert (s.broker_url, s.task_acks_late) == ("memory://ns", False)
    old = {"BROKER_URL": "memory://old", "CELERYD_CONCURRENCY": 2,
           "CELERY_ALWAYS_EAGER": True}
    s = Settings.from_object(old)
    assert (s.broker_url, s.worker_concurrency, s.task_always_eager) == (
        "memory://old", 2, True)
    assert OLD_NAMES["CELERYD_PREFETCH_MULTIPLIER"] == "worker_prefetch_multiplier"


def test_the_environment_refuses_celery_settings_celeriac_does_not_do() -> None:
    s = Settings.from_env({"CELERIAC_WORKER_CONCURRENCY": "2", "CELERIAC_APP": "proj"})
    assert s.worker_concurrency == 2
    with pytest.raises(ConfigurationError, match="worker_pool_start_method"):
        Settings.from_env({"CELERIAC_WORKER_POOL_START_METHOD": "spawn"})
    assert Settings.from_env({"CELERIAC_TASK_COMPRESSION": "gzip"}).task_compression == "gzip"


def test_app_conf_reads_and_changes_until_finalized() -> None:
    app = Celeriac("conf", broker="memory://conf")
    app.conf.task_default_queue = "jobs"
    app.conf.update({"task_acks_late": False}, worker_concurrency="2")
    app.conf["task_default_priority"] = 3
    assert (app.conf.task_default_queue, app.conf["task_acks_late"]) == ("jobs", False)
    assert (app.settings.worker_concurrency, app.conf.get("task_default_priority")) == (2, 3)
    assert "broker_url" in app.conf and app.conf.get("nope", 1) == 1
    app.finalize()
    # Celery allows changes after finalize: they take effect for what reads per call.
    app.conf.task_default_queue = "other"
    assert app.routing.route("any.task") == "other"
    with pytest.raises(ConfigurationError, match="task_serializer: unknown serializer"):
        app.conf.task_serializer = "yaml"
    app.transport  # noqa: B018 - connected: the connection settings are fixed now
    with pytest.raises(ConfigurationError, match="broker_url cannot change once the app "
                                                 "has connected"):
        app.conf.broker_url = "memory://elsewhere"
    app.conf.broker_url = "memory://conf"  # the same value is no change
    app.close()
    app.conf.broker_url = "memory://elsewhere"  # closed: the next connection uses it
    app.close()


def test_settings_of_services_celeriac_lacks_are_harmless_and_read_back(
        caplog: pytest.LogCaptureFixture) -> None:
    for name in ("cassandra_servers", "cassandra_keyspace"):
        config_module._warned.discard(name)
    app = Celeriac("svc", broker="memory://svc")
    with caplog.at_level(logging.WARNING, logger="celeriac.config"):
        app.conf.update(cassandra_servers=["localhost"], cassandra_keyspace="tests")
        app.conf.update(cassandra_servers=["other"])
    lines = [r.getMessage() for r in caplog.records if "cassandra" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "cassandra_servers, cassandra_keyspace" in lines[0]
    assert "have no effect in celeriac" in lines[0]
    assert app.conf.cassandra_servers == ["other"] and app.conf["cassandra_keyspace"] == "tests"
    # Unset harmless names read Celery's default; they are part of the table once set.
    assert app.conf.worker_hijack_root_logger is True
    assert "cassandra_servers" in app.conf.table() and "cassandra_servers" in app.conf
    # Asking to use the service is the error, naming its scheme.
    app.conf.result_backend = "cassandra://"
    with pytest.raises(ConfigurationError, match="unknown result backend URL scheme "
                                                 "'cassandra'"):
        app.backend  # noqa: B018
    # database_* configure the SQLAlchemy backend's tables, which db+postgresql:// has.
    with pytest.raises(ConfigurationError, match=r"database_table_names=.* not supported"):
        app.conf.database_table_names = {"task": "mine"}
    app.close()


def test_conf_update_after_finalize_reaches_the_producer() -> None:
    app = Celeriac("late", broker="memory://late")

    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    app.finalize()
    app.conf.task_allow_error_cb_on_chord_header = True  # the suite flips it per test
    assert app.conf.task_allow_error_cb_on_chord_header is True
    app.conf.task_always_eager = True
    assert add.delay(2, 3).get() == 5  # eager now: nothing sent
    app.conf.task_always_eager = False
    app.close()


def test_config_from_object_by_name_with_namespace(tmp_path: Any, monkeypatch: Any) -> None:
    (tmp_path / "portcfg.py").write_text(
        "CELERY_BROKER_URL = 'memory://portcfg'\nCELERY_TASK_ROUTES = "
        "{'mail.*': {'queue': 'email'}}\nDEBUG = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    app = Celeriac("port")
    app.config_from_object("portcfg", namespace="CELERY")
    assert app.conf.broker_url == "memory://portcfg"
    assert app.route("mail.send") == "email" and app.route("other") == "celery"
    with pytest.raises(ConfigurationError, match="cannot import configuration 'nosuchcfg'"):
        app.config_from_object("nosuchcfg")
    app.close()


def test_routers_in_celerys_forms() -> None:
    def celery_router(name: str, args: Any, kwargs: Any, options: Any, task: Any = None,
                      **kw: Any) -> dict[str, str] | None:
        return {"queue": "fast"} if name.startswith("f.") else None

    s = Settings(task_routes=[celery_router, {"b.*": "bulk"}, lambda name: None])
    app = Celeriac("routes", broker="memory://routes", settings=s)
    assert [app.route(n) for n in ("f.x", "b.y", "c.z")] == ["fast", "bulk", "celery"]
    app.close()


def test_task_queues_in_celerys_forms() -> None:
    from kombu import Exchange, Queue

    s = Settings(task_queues=[Queue("default"), Queue("feeds", routing_key="feed.import"),
                              Queue("media", Exchange("media"), routing_key="media.video",
                                    queue_arguments={"x-max-priority": 10})],
                 task_routes={"f.*": {"routing_key": "feed.import"},
                              "m.*": {"exchange": "media", "routing_key": "media.video"},
                              "q.*": {"queue": "default"}})
    app = Celeriac("queues", broker="memory://queues", settings=s)
    assert app.default_queues == ["default", "feeds", "media"]
    assert [app.route(n) for n in ("f.x", "m.x", "q.x", "other")] == [
        "feeds", "media", "default", "celery"]
    app.send_task("other", routing_key="media.video")
    app.send_task("other", exchange="media", routing_key="media.video")
    with pytest.raises(ConfigurationError, match="exchange='elsewhere' is not supported"):
        app.send_task("other", exchange="elsewhere", routing_key="media.video")
    app.send_task("other", routing_key="unbound")  # no queue bound by it: the queue of that name
    assert app.transport.queue_length("media") == 2
    assert app.transport.queue_length("unbound") == 1
    app.close()

    # Celery's old dict (CELERY_QUEUES), plain names, and the environment's names.
    old = Settings.from_object({"CELERY_QUEUES": {"a": {"exchange": "a", "routing_key": "a.1"},
                                                   "b": {"binding_key": "b.1"},
                                                   "c": Queue("c", routing_key="c.1")}})
    app = Celeriac("o", broker="memory://o", settings=old)
    assert app.default_queues == ["a", "b", "c"]
    assert [app.queue_for_key(k) for k in ("a.1", "b.1", "c.1", "d")] == ["a", "b", "c", "d"]
    assert Celeriac("n", broker="memory://n",
                    settings=Settings(task_queues=["x", "y"])).default_queues == ["x", "y"]
    env = Settings.from_env({"CELERIAC_TASK_QUEUES": "hi, lo"})
    assert Celeriac("e", broker="memory://e", settings=env).default_queues == ["hi", "lo"]
    # Without task_queues a worker consumes the default queue.
    assert Celeriac("d", broker="memory://d").default_queues == ["celery"]


@pytest.mark.parametrize(("queues", "message"), [
    (lambda k: [k.Queue("h", k.Exchange("h", type="headers"))],
     "queue 'h' is bound to a headers exchange"),
    (lambda k: [k.Queue("b", bindings=[k.binding(k.Exchange("x"), routing_key="1"),
                                       k.binding(k.Exchange("x"), routing_key="2")])],
     "queue 'b' has several bindings"),
    (lambda k: [k.Queue("ttl", queue_arguments={"x-message-ttl": 1000})],
     r"queue 'ttl': queue_arguments \['x-message-ttl'\] are not supported"),
    (lambda k: [k.Queue("a", routing_key="k"), k.Queue("b", routing_key="k")],
     "queues 'a' and 'b' are bound by the same routing key 'k'"),
    (lambda k: ["a", "a"], "queue 'a' is declared twice"),
    (lambda k: "a,b", "task_queues: expected a list of queues, got str"),
    (lambda k: [42], "expected a queue name or a kombu Queue, got 42"),
    (lambda k: {"t": {"exchange_type": "topic"}}, "topic queue 't' needs an exchange name"),
])
def test_task_queues_that_route_otherwise_here_are_refused_naming_the_queue(
        queues: Any, message: str) -> None:
    import kombu

    with pytest.raises(ConfigurationError, match=message):
        Settings(task_queues=queues(kombu))


def test_a_route_through_an_exchange_no_declared_queue_is_bound_to_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="exchange 'media' is not supported"):
        Settings(task_routes={"m.*": {"exchange": "media", "routing_key": "media.video"}})


def test_celerys_default_exchange_and_routing_key_with_declared_queues() -> None:
    from kombu import Exchange, Queue

    queues = (Queue("default", Exchange("default"), routing_key="default"),
              Queue("videos", Exchange("media"), routing_key="media.video"))
    s = Settings(task_queues=queues, task_default_queue="default",
                 task_default_exchange="default", task_default_routing_key="default")
    app = Celeriac("dx", broker="memory://dx", settings=s)
    assert app.route("any.task") == "default"
    app.send_task("any.task", exchange="default")  # the default exchange may be named
    assert app.transport.queue_length("default") == 1
    app.close()
    # The default key picks the queue unrouted tasks go to, as on RabbitMQ.
    videos = Settings(task_queues=queues, task_default_routing_key="media.video")
    assert Celeriac("dv", broker="memory://dv", settings=videos).route("t") == "videos"
    # Without task_queues they change nothing: the default queue takes unrouted tasks.
    plain = Settings(task_default_exchange="tasks", task_default_routing_key="task.default")
    assert Celeriac("dp", broker="memory://dp", settings=plain).route("t") == "celery"
    with pytest.raises(ConfigurationError, match="task_default_routing_key='nowhere': no "
                                                 "queue of task_queues is bound by it"):
        Settings(task_queues=queues, task_default_routing_key="nowhere")
    with pytest.raises(ConfigurationError, match="task_default_exchange='other': no queue"):
        Settings(task_queues=queues, task_default_exchange="other")
    with pytest.raises(ConfigurationError, match=r"task_default_exchange_type must be "
                                                 r"'direct' or 'topic', got 'headers'"):
        Settings.from_object({"task_default_exchange_type": "headers"})


def test_create_missing_queues_false_refuses_undeclared_queues() -> None:
    s = Settings(task_queues=["default", "media"], task_default_queue="default",
                 task_create_missing_queues=False)
    app = Celeriac("strict", broker="memory://strict", settings=s)
    app.send_task("t", queue="media")
    with pytest.raises(ConfigurationError, match="cannot send t: queue 'other' is not "
                                                 "declared in task_queues"):
        app.send_task("t", queue="other")
    assert app.transport.queue_length("other") == 0
    assert app.transport.queue_length("media") == 1
    app.close()
    # Without task_queues there is nothing to check against: queues are made on use.
    loose = Celeriac("loose", broker="memory://loose",
                     settings=Settings(task_create_missing_queues=False))
    loose.send_task("t", queue="anywhere")
    loose.close()
