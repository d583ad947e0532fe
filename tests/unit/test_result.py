import pytest

from celeriac import Celeriac, ResultTimeout, TaskFailed, TaskRevoked, states
from celeriac.backends.base import exception_to_dict
from celeriac.result import rebuild_exception


class Mine(Exception):
    pass


def test_builtin_exceptions_are_recreated() -> None:
    exc = rebuild_exception(exception_to_dict(KeyError("k")), "tb")
    assert isinstance(exc, KeyError) and exc.args == ("k",)


def test_unknown_types_are_never_imported() -> None:
    data = {"exc_type": "system", "exc_module": "os", "exc_message": ["rm -rf /"]}
    exc = rebuild_exception(data, None)
    assert isinstance(exc, TaskFailed) and exc.exc_type == "os.system"


def test_non_exception_builtins_are_refused() -> None:
    exc = rebuild_exception({"exc_type": "eval", "exc_module": "builtins",
                             "exc_message": ["1"]}, None)
    assert isinstance(exc, TaskFailed)


def test_allowlisted_user_type() -> None:
    data = exception_to_dict(Mine("m"))
    assert isinstance(rebuild_exception(data, None, (Mine,)), Mine)


def test_a_user_type_is_re_raised_when_its_module_is_imported_here_else_task_failed() -> None:
    # Celery re-raises the task's own exception type; so do we, when the reader has
    # imported its module already (never importing one on the word of stored data).
    exc = rebuild_exception(exception_to_dict(Mine("m")), "tb")
    assert type(exc) is Mine and exc.args == ("m",)
    elsewhere = {"exc_type": "Mine", "exc_module": "not_imported_anywhere.errors",
                 "exc_message": ["m"]}
    assert isinstance(rebuild_exception(elsewhere, None), TaskFailed)
    local = {"exc_type": "f.<locals>.Err", "exc_module": __name__, "exc_message": ["x"]}
    assert isinstance(rebuild_exception(local, None), TaskFailed)
    not_an_exception = {"exc_type": "rebuild_exception", "exc_module": __name__,
                        "exc_message": []}
    assert isinstance(rebuild_exception(not_an_exception, None), TaskFailed)


def test_pending_then_ready(memory_app: Celeriac) -> None:
    r = memory_app.AsyncResult("some-id")
    assert r.state == states.PENDING and not r.ready() and r.result is None
    with pytest.raises(ResultTimeout):
        r.get(timeout=0.05)
    memory_app.backend.store("some-id", states.SUCCESS, {"ok": True})
    assert r.get(timeout=1) == {"ok": True} and r.successful()
    r.forget()
    assert r.state == states.PENDING


def test_revoked_raises_task_revoked(memory_app: Celeriac) -> None:
    memory_app.backend.store("rid", states.REVOKED, {"exc_message": ["expired"]})
    with pytest.raises(TaskRevoked, match="expired"):
        memory_app.AsyncResult("rid").get(timeout=1)


def test_get_rejects_negative_timeout(memory_app: Celeriac) -> None:
    with pytest.raises(ValueError, match="timeout must be >= 0"):
        memory_app.AsyncResult("x").get(timeout=-1)
