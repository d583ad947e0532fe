import pytest

from celeriac import Celeriac, ConfigurationError, Settings


def test_defaults_are_the_embedded_broker_and_at_least_once() -> None:
    s = Settings()
    assert s.broker_url == "sqlite:///celeriac.db"
    assert s.backend_url == "sqlite:///celeriac.db"
    assert s.task_acks_late is True
    assert s.accept_content == ("json",)
    assert s.result_expires == 86400
    assert s.max_message_size == 64 * 1024 * 1024


def test_from_env_parses_types() -> None:
    s = Settings.from_env({
        "CELERIAC_BROKER_URL": "memory://x",
        "CELERIAC_TASK_ACKS_LATE": "false",
        "CELERIAC_WORKER_PREFETCH_MULTIPLIER": "8",
        "CELERIAC_RESULT_EXPIRES": "none",
        "CELERIAC_ACCEPT_CONTENT": "json, msgpack",
        "CELERIAC_TASK_ROUTES": "a.*=alpha,b=beta",
        "UNRELATED": "1",
    })
    assert s.broker_url == "memory://x"
    assert s.task_acks_late is False
    assert s.worker_prefetch_multiplier == 8
    assert s.result_expires is None
    assert s.accept_content == ("json", "msgpack")
    assert s.task_routes == {"a.*": "alpha", "b": "beta"}


def test_from_env_names_the_variable_on_bad_value() -> None:
    with pytest.raises(ConfigurationError, match="CELERIAC_TASK_ACKS_LATE='maybe'"):
        Settings.from_env({"CELERIAC_TASK_ACKS_LATE": "maybe"})


def test_from_object_module_style() -> None:
    class Config:
        broker_url = "memory://cfg"
        task_default_queue = "jobs"
        SOMETHING_ELSE = 1

    s = Settings.from_object(Config)
    assert (s.broker_url, s.task_default_queue) == ("memory://cfg", "jobs")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"worker_prefetch_multiplier": 0}, "worker_prefetch_multiplier must be >= 1"),
        ({"task_default_priority": 10}, "task_default_priority must be 0-9"),
        ({"task_max_deliveries": 0}, "task_max_deliveries must be >= 1"),
        ({"no_such_setting": 1}, "unknown setting"),
    ],
)
def test_invalid_settings_name_the_parameter(change: dict[str, int], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Settings().replace(**change)


def test_app_keywords_override_settings() -> None:
    app = Celeriac("x", broker="memory://a", settings=Settings(task_default_queue="q"),
                   task_acks_late=False)
    assert app.conf.broker_url == "memory://a"
    assert app.conf.task_default_queue == "q"
    assert app.conf.task_acks_late is False
