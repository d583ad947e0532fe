"""Tasks keep their signatures for the type checker (ParamSpec)."""

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

SNIPPET = '''
from typing import Any

from celeriac import AsyncResult, Celeriac, Task

app = Celeriac("typing")

@app.task
def add(x: int, y: int) -> int:
    return x + y

@app.task(bind=True, max_retries=3)
def bound(self: Task[Any, Any], n: int) -> str:
    return str(n)

ok: AsyncResult[int] = add.delay(1, 2)
value: int = add.delay(1, 2).get()
s: str = bound.delay(3).get()
add.delay("a", 2)  # E1
add.delay(1)  # E2
bound.delay("x")  # E3
wrong: str = add.delay(1, 2).get()  # E4

@app.task
async def fetch(url: str) -> bytes:
    return url.encode()

body: bytes = fetch.delay("u").get()  # an async task's result: what its coroutine returns
fetch.delay(1)  # E5
not_str: str = fetch.delay("u").get()  # E6
'''


def test_delay_is_typed_like_the_function(tmp_path: Path) -> None:
    from mypy import api

    path = tmp_path / "snippet.py"
    path.write_text(SNIPPET)
    # The project's own cache: `make lint` (run before the tests in CI) has just checked
    # the package with the same options, so only the snippet is checked here (~1 s
    # against ~30 s from nothing).
    out, _err, _code = api.run(["--strict", "--cache-dir", str(ROOT / ".mypy_cache"),
                                "--config-file", str(ROOT / "pyproject.toml"), str(path)])
    lines = SNIPPET.splitlines()
    flagged = {int(line.split(":")[1]) for line in out.splitlines() if ": error:" in line}
    expected = {i + 1 for i, line in enumerate(lines) if "# E" in line}
    assert flagged == expected, out
