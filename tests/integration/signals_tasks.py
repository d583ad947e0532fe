"""Tasks of test_signals' worker, importable by the test process (no receivers here:
``signals_app`` connects them in the worker only).

The app reads its settings from CELERIAC_* variables; the test points its own copy at
the same Redis namespace.
"""

from __future__ import annotations

from celeriac import Celeriac, Settings

app = Celeriac("sigtest", settings=Settings.from_env())


@app.task
def ok(x: int, y: int = 0) -> int:
    return x + y


@app.task
def boom(value: str, flag: str | None = None) -> None:
    raise ValueError(f"bad {value}")


@app.task(bind=True, max_retries=2)
def flaky(self, n: int) -> int:  # type: ignore[no-untyped-def]
    if self.request.retries < 1:
        raise self.retry(exc=ConnectionError("try again"), countdown=0.1)
    return n


@app.task
def spawn(x: int) -> str:
    """Sends another task from inside the worker: the child publishes it."""
    return ok.delay(x, 1).id
