import celeriac

EXPECTED = {
    "AsyncResult", "BrokerError", "BrokerUnavailable", "Celeriac", "CeleriacError", "ChordError",
    "ConfigurationError", "ContentDisallowed", "DecodeError", "EagerResult", "EncodeError",
    "GroupResult", "Hooks", "Ignore", "MaxRetriesExceededError", "MessageTooLarge", "NotRegistered",
    "OperationalError", "Reject",
    "Request", "ResultTimeout", "Retry", "SerializationError", "Settings", "Signature",
    "SoftTimeLimitExceeded", "Task", "TaskControl", "TaskError", "TaskFailed", "TaskRevoked",
    "TimeLimitExceeded", "Worker", "WorkerLostError", "WorkerShutdown", "WorkerTerminate",
    "__version__", "chain", "chord", "chunks", "current_app", "group", "shared_task", "signals",
    "signature", "states",
}


def test_public_names_are_exactly_the_curated_list() -> None:
    assert set(celeriac.__all__) == EXPECTED
    assert sorted(celeriac.__all__) == list(celeriac.__all__)
    for name in celeriac.__all__:
        assert hasattr(celeriac, name), name


def test_exception_tree() -> None:
    from celeriac import errors as e

    assert issubclass(e.ResultTimeout, TimeoutError)
    assert issubclass(e.Retry, e.TaskControl) and not issubclass(e.Retry, e.TaskError)
    assert not issubclass(e.WorkerShutdown, Exception)
    assert issubclass(e.WorkerTerminate, e.WorkerShutdown)
    assert issubclass(e.ContentDisallowed, e.DecodeError)
    for name in dir(e):
        obj = getattr(e, name)
        if isinstance(obj, type) and issubclass(obj, Exception) and obj.__module__ == e.__name__:
            assert issubclass(obj, e.CeleriacError), name
            assert name in e.__doc__, f"{name} missing from the tree in errors.__doc__"


def test_python_dash_m_runs_the_cli() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "celeriac", "--help"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0
    for command in ("worker", "call", "result", "purge"):
        assert command in out.stdout
