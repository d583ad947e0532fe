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
from tests.services import require

HEAVY = ("celeriac.worker", "celeriac.dashboard", "celeriac.cli", "asyncio", "ssl", "click",
         "rich")
"""What a producer never needs (a module or any of its submodules)."""
UNTIL_USED = ("celeriac.stores", "pickle", "bz2", "lzma", "difflib", "socket")
"""What a producer loads only when it uses it: the shared store (``unique_for``,
``debounce``), pickle, bz2 and lzma compression, the misspelt-setting hint, the host name
of the ``origin`` header (the broker's client brings socket with its first connection)."""


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
    modules = loaded_after(code)
    assert heavy_in(modules) == []
    assert heavy_in(modules, UNTIL_USED) == []


def test_what_a_producer_defers_is_there_when_used() -> None:
    code = """
from celeriac import Celeriac
from celeriac.errors import ConfigurationError
from celeriac.protocol import origin
from celeriac.serialization import compression, get_serializer
app = Celeriac("costs", broker="memory://")
for name in ("bzip2", "lzma"):
    kind, data = compression.compress(b"x" * 100, name)
    assert compression.decompress(data, kind, 1000) == b"x" * 100
pickled = get_serializer("pickle")
assert pickled.loads(pickled.dumps({"a": 1})) == {"a": 1}
assert "@" in origin()
try:
    Celeriac("costs", broker="memory://", task_default_queeu="x")
except ConfigurationError as exc:
    assert "did you mean task_default_queue" in str(exc), exc
else:
    raise AssertionError("a misspelt setting was taken")
"""
    modules = loaded_after(code)
    assert {"pickle", "bz2", "lzma", "difflib", "socket"} <= set(modules)


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


def test_a_redis_connection_does_not_read_the_package_metadata() -> None:
    # redis-py 8 reads its version from the package metadata for every connection (1 ms
    # each, 7 ms the first) unless given it: the connector gives it once.
    url = require("redis")
    code = f"""
import asyncio, redis, redis.utils
calls = []
real = redis.utils.get_lib_version
redis.utils.get_lib_version = lambda: calls.append(1) or real()
from celeriac.clients.redis.connector import Connector
from celeriac.settings import Settings

async def aping(connector):
    return await connector.acall(lambda client, ns: client.client_info())

for role in ("broker", "backend", "store"):
    connector = Connector([{url!r} + "?namespace=import-cost"], Settings(), role,
                          read_timeout=5)
    for info in (connector.call(lambda client, ns: client.client_info()),
                 asyncio.run(aping(connector))):
        assert info["name"] == f"celeriac-{{role}}:import-cost", info
        # Redis >= 7.2 keeps what CLIENT SETINFO told it: what redis-py would have said.
        assert info.get("lib-ver", redis.__version__) == redis.__version__, info
assert calls == [], calls
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_worker_leaves_the_cluster_state_to_gossip_and_settings_compare() -> None:
    # events/__init__ resolves its names when asked (the dispatcher alone for a worker's
    # or producer's events); Gossip imports the cluster state as it starts.
    modules = loaded_after("import celeriac.cli.worker, celeriac.worker.gossip, "
                           "celeriac.worker.steps; from celeriac.events import EventDispatcher")
    assert heavy_in(modules, ("celeriac.events.state", "celeriac.events.cameras")) == []
    from celeriac.events import ClusterState, JSONLinesCamera  # still there when asked for
    from celeriac.settings import Settings

    assert ClusterState.__module__ == "celeriac.events.state" and JSONLinesCamera
    # Settings' hand-written __eq__/__hash__ behave as dataclass's did.
    assert Settings() == Settings() and Settings() != Settings(broker_url="memory://")
    assert Settings().__eq__(object()) is NotImplemented
    with pytest.raises(TypeError):
        hash(Settings())  # its dict fields are unhashable, as with dataclass's __hash__
