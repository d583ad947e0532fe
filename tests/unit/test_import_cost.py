"""Start-up cost (issue 30): ``import celeriac`` and a producer's imports leave out the
worker, asyncio, ssl, the command line and the dashboard; ``celeriac --help`` lists every
command without importing one. Each check runs in a fresh interpreter (``sys.modules``
of this one is full of everything the suite imported)."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest

from celeriac.cli import LAZY, main

HEAVY = ("celeriac.worker", "celeriac.dashboard", "celeriac.cli", "asyncio", "ssl", "click",
         "rich")
"""What a producer never needs (a module or any of its submodules)."""


def loaded_after(code: str) -> list[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, check=True)
    return list(json.loads(out.stdout.splitlines()[-1]))


def heavy_in(modules: list[str], heavy: tuple[str, ...] = HEAVY) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(f"{h}.") for h in heavy)]


def test_import_celeriac_loads_only_the_package_itself() -> None:
    modules = loaded_after("import celeriac")
    assert [m for m in modules if m.startswith("celeriac")] == ["celeriac", "celeriac.__about__"]
    assert heavy_in(modules) == []


def test_a_producer_never_imports_the_worker_asyncio_ssl_or_the_cli() -> None:
    code = """
from celeriac import Celeriac, chain, group, shared_task
app = Celeriac("costs", broker="redis://127.0.0.1:6379/0", backend="redis://127.0.0.1:6379/0")

@app.task
def add(x, y):
    return x + y

@shared_task
def mul(x, y):
    return x * y

chain(add.s(1, 2), mul.s(3))
group(add.s(1, 1), add.s(2, 2))
app.finalize()
"""
    assert heavy_in(loaded_after(code)) == []


def test_every_public_name_resolves_in_a_fresh_interpreter() -> None:
    # ``from celeriac import *`` goes through the package's lazy ``__getattr__``, the
    # worker included (it is asked for).
    modules = loaded_after("from celeriac import *\nassert Worker and Celeriac and states")
    assert "celeriac.worker" in modules and "celeriac.app" in modules


def test_help_lists_every_command_without_importing_one() -> None:
    code = """
import sys
from celeriac.cli import main
try:
    main(["--help"], prog_name="celeriac")
except SystemExit:
    pass
"""
    modules = loaded_after(code)
    assert heavy_in(modules, ("celeriac.app", "celeriac.worker", "celeriac.dashboard",
                              "asyncio", "rich")) == []
    assert sorted(m for m in modules if m.startswith("celeriac.cli.")) == ["celeriac.cli.loader"]


@pytest.mark.parametrize("width", [40, 80, 200])
def test_the_lazy_listing_is_each_commands_own_short_help(width: int) -> None:
    for name, (module, sentence) in LAZY.items():
        command = main.get_command(click.Context(main), name)
        assert isinstance(command, click.Command), name
        assert command.name == name and command.callback is not None
        assert command.callback.__module__ == f"celeriac.cli.{module}", name
        stand_in = click.Command(name, help=sentence)
        assert stand_in.get_short_help_str(width) == command.get_short_help_str(width), name
    assert set(main.list_commands(click.Context(main))) == set(LAZY) | set(main.commands)


def test_a_command_added_the_eager_way_is_listed_and_runs() -> None:
    group = type(main)(name="probe", commands={})

    @click.command("hello")
    def hello() -> None:
        """Say hello."""
        click.echo("hello")

    group.add_command(hello)
    ctx = click.Context(group)
    assert "hello" in group.list_commands(ctx)
    assert group.get_command(ctx, "hello") is hello
